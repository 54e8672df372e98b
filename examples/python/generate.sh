#!/usr/bin/env bash
# Generates berth's Python stubs from proto/ into OUT_DIR (default: examples/python/berth_api).
#
#   examples/python/generate.sh [OUT_DIR]
#
# OUT_DIR then holds `berth/{sessions,locks,budget}/v1/*_pb2.py` (messages, with .pyi type hints),
# their `*_pb2_grpc.py` service stubs, `health_pb2*.py` for grpc.health.v1, and `status_pb2.py` and
# `error_details_pb2.py` for google.rpc (what berth's errors carry in grpc-status-details-bin). Put
# OUT_DIR on sys.path (berth_client does it for the default folder). Nothing generated is kept
# in git: proto/ is the source.
#
# One compiler for everything: `protoc` (3.15 or later, for proto3 `optional`; Debian 12 has 3.21)
# with gRPC's Python plugin, `grpc_python_plugin` (Debian's protobuf-compiler-grpc), for the service
# stubs. The protos are compiled as they are.
#
# Settings (environment): PROTOC (default protoc), GRPC_PYTHON_PLUGIN (default grpc_python_plugin
# on PATH), PROTO_INCLUDE (where google/protobuf/*.proto are; default /usr/include, Debian's
# libprotobuf-dev).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
out=${1:-$here/berth_api}
protoc=${PROTOC:-protoc}
plugin=${GRPC_PYTHON_PLUGIN:-$(command -v grpc_python_plugin || true)}
wkt=${PROTO_INCLUDE:-/usr/include}
proto="$root/proto"

die() { echo "generate.sh: $*" >&2; exit 1; }

command -v "$protoc" >/dev/null || die "$protoc not found: apt-get install protobuf-compiler"
[ -n "$plugin" ] && [ -x "$plugin" ] || die "grpc_python_plugin not found: apt-get install protobuf-compiler-grpc (or set GRPC_PYTHON_PLUGIN)"
[ -f "$wkt/google/protobuf/duration.proto" ] || die "no google/protobuf/*.proto in $wkt: apt-get install libprotobuf-dev (or set PROTO_INCLUDE)"

# "libprotoc 3.21.12" -> 3021
version=$("$protoc" --version | sed -E 's/^libprotoc ([0-9]+)\.([0-9]+).*/\1 \2/' | { read -r major minor; echo $((major * 1000 + minor)); })
[ "$version" -ge 3015 ] || die "$("$protoc" --version) is too old for proto3 'optional' (needs 3.15)"

berth_protos=()
while IFS= read -r file; do berth_protos+=("$file"); done < <(cd "$proto" && find berth -name '*.proto' | sort)

mkdir -p "$out"
python_out=(--python_out="$out" --pyi_out="$out" --plugin=protoc-gen-grpc_python="$plugin" --grpc_python_out="$out")

# Messages with type hints, and the service stubs (the plugin writes a *_pb2_grpc.py for every file;
# those of files without a service are empty).
"$protoc" -I "$proto" -I "$wkt" "${python_out[@]}" "${berth_protos[@]}"

# grpc.health.v1, compiled as a top-level `health.proto`: generated at its own path it would make a
# `grpc/` folder that hides the grpcio module. The wire names (package grpc.health.v1) are the same.
"$protoc" -I "$proto/grpc/health/v1" "${python_out[@]}" health.proto

# google.rpc's Status and error details (ErrorInfo, RetryInfo, BadRequest), which berth's errors
# carry in grpc-status-details-bin; compiled as top-level `status.proto` and `error_details.proto`
# for the same reason (a `google/` folder would hide the protobuf runtime's own `google` package).
# Debian ships no Python module for them.
"$protoc" -I "$proto/google/rpc" -I "$wkt" --python_out="$out" --pyi_out="$out" status.proto error_details.proto

echo "generated Python stubs in $out"
