#!/usr/bin/env bash
# Regenerates the Python stubs in leaseq/v1/ from the repository's proto/.
# The generated files are committed, so users of the package need neither this
# script nor grpcio-tools. Run it after changing proto/leaseq/v1/*.proto.
#
# The grpcio-tools version is pinned to an OLD one on purpose: 1.49.1 bundles
# protoc 21, whose Python code only needs protobuf >= 3.20 (the `builder`
# module) and checks no versions at import time, so the committed stubs load
# on every protobuf from 4.21 to 7.x and on any grpcio. Generators from
# grpcio-tools 1.63 / protobuf 5.26 on add import-time checks that refuse an
# older runtime (`ValidateProtobufRuntimeVersion`, `GRPC_GENERATED_VERSION`),
# which would raise pyproject.toml's floor to theirs. grpcio-tools 1.49.1 has
# wheels for CPython 3.7-3.10: run this with one of those, e.g.
#   python3.9 -m venv /tmp/gen && /tmp/gen/bin/pip install grpcio-tools==1.49.1
#   PYTHON=/tmp/gen/bin/python ./generate.sh
# The *_pb2.py / *_pb2.pyi files are also reproduced byte for byte by the
# protoc of Debian 12's protobuf-compiler (3.21.12, the same protoc 21), when
# only they change (file options, say: the *_grpc.py files hold no
# descriptor):
#   protoc -I ../../proto --python_out=. --pyi_out=. leaseq/v1/queue.proto leaseq/v1/admin.proto
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
proto="$here/../../proto"
python="${PYTHON:-$here/.venv/bin/python}"
[ -x "$python" ] || python=python3

if ! "$python" -c 'import grpc_tools' 2>/dev/null; then
    echo "grpcio-tools is missing: $python -m pip install 'grpcio-tools==1.49.1' (CPython <= 3.10)" >&2
    exit 1
fi

tools="$("$python" -c 'from importlib.metadata import version; print(version("grpcio-tools"))')"
if [ "$tools" != "1.49.1" ]; then
    echo "grpcio-tools $tools found; the committed stubs are made with 1.49.1 (see above)" >&2
    exit 1
fi

rm -f "$here"/leaseq/v1/*_pb2*.py "$here"/leaseq/v1/*_pb2*.pyi
# -I proto with the path leaseq/v1/queue.proto makes the generated imports
# read `from leaseq.v1 import queue_pb2`, which is this package's own layout.
"$python" -m grpc_tools.protoc -I "$proto" \
    --python_out="$here" --pyi_out="$here" --grpc_python_out="$here" \
    leaseq/v1/queue.proto leaseq/v1/admin.proto
touch "$here/leaseq/v1/__init__.py"
echo "generated: $(cd "$here" && ls leaseq/v1/*_pb2*)"
