#!/usr/bin/env bash
# Regenerates the Python stubs in leaseq/v1/ from the repository's proto/.
# The generated files are committed, so users of the package need neither this
# script nor grpcio-tools. Run it after changing proto/leaseq/v1/*.proto.
#
# The grpcio-tools version is pinned: the generated code checks at import time
# that the installed grpcio and protobuf are at least as new as the generator,
# which is what the lower bounds in pyproject.toml say. Bump both together.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
proto="$here/../../proto"
python="${PYTHON:-$here/.venv/bin/python}"
[ -x "$python" ] || python=python3

if ! "$python" -c 'import grpc_tools' 2>/dev/null; then
    echo "grpcio-tools is missing: $python -m pip install 'grpcio-tools==1.76.0'" >&2
    exit 1
fi

rm -f "$here"/leaseq/v1/queue_pb2*.py "$here"/leaseq/v1/queue_pb2*.pyi
# -I proto with the path leaseq/v1/queue.proto makes the generated imports
# read `from leaseq.v1 import queue_pb2`, which is this package's own layout.
"$python" -m grpc_tools.protoc -I "$proto" \
    --python_out="$here" --pyi_out="$here" --grpc_python_out="$here" \
    leaseq/v1/queue.proto
touch "$here/leaseq/v1/__init__.py"
echo "generated: $(cd "$here" && ls leaseq/v1/queue_pb2*)"
