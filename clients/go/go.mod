// leaseq's Go module: the generated package leaseq/v1 (committed; made by
// `./generate.sh` or `buf generate` at the repository root), the worker
// package, and the example of docs/clients.md. Its versions are git tags
// clients/go/vX.Y.Z (the repository's one version: worker.Version). The
// versions required are the oldest the test suite builds against (Debian
// 12's); no go.sum is committed (`go mod tidy` in your module writes yours).
module github.com/leaseq/leaseq/clients/go

go 1.19

require (
	google.golang.org/grpc v1.33.3
	google.golang.org/protobuf v1.28.1
)
