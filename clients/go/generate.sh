#!/usr/bin/env bash
# Generates the Go package of proto/leaseq/v1 into clients/go/leaseq/v1 (the
# output is committed: `go get` users build it; tests/go_example.rs checks
# it is current) with protoc and its two Go plugins (Debian: apt-get install
# protobuf-compiler protoc-gen-go protoc-gen-go-grpc; elsewhere `go install
# google.golang.org/protobuf/cmd/protoc-gen-go@latest
# google.golang.org/grpc/cmd/protoc-gen-go-grpc@latest`). `buf generate` at
# the repository root does the same from buf.gen.yaml.
#
#   clients/go/generate.sh [OUT]     OUT defaults to clients/go
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
out="${1:-$here}"
mkdir -p "$out"
protoc -I "$here/../../proto" \
    --go_out="$out" --go_opt=paths=source_relative \
    --go-grpc_out="$out" --go-grpc_opt=paths=source_relative \
    leaseq/v1/queue.proto leaseq/v1/admin.proto
echo "generated: $(cd "$out" && ls leaseq/v1/*.go | tr '\n' ' ')"
