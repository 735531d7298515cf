// The Go example of docs/clients.md, and where `./generate.sh` (or `buf
// generate` at the repository root) puts the generated package, leaseq/v1.
// Not published: no go.sum is committed (`go mod tidy` writes it). The
// versions are the oldest the test suite builds against (Debian 12's).
module github.com/leaseq/leaseq/clients/go

go 1.19

require (
	google.golang.org/grpc v1.33.3
	google.golang.org/protobuf v1.28.1
)
