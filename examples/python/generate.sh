#!/usr/bin/env bash
# Generates berth's Python stubs from proto/ into OUT_DIR (default: examples/python/berth_api).
#
#   examples/python/generate.sh [OUT_DIR]
#
# OUT_DIR then holds `berth/{sessions,locks,budget}/v1/*_pb2.py` (messages, with .pyi type hints),
# their `*_pb2_grpc.py` service stubs, `health_pb2*.py` for grpc.health.v1, and `status_pb2.py` and
# `error_details_pb2.py` for google.rpc (what berth's errors carry). Put
# OUT_DIR on sys.path (berth_client.py does it for the default folder). Nothing generated is kept
# in git: proto/ is the source.
#
# Settings (environment): PYTHON (default /usr/bin/python3, the interpreter with Debian's grpcio and
# grpc_tools), PROTOC (default protoc, 3.15 or later).
#
# Why two compilers: messages come from `protoc` (Debian 12: 3.21), because berth's protos use
# proto3 `optional`, which needs protoc 3.15 or later. Service stubs come from grpc_tools'
# built-in plugin; Debian 12's python3-grpc-tools 1.14 carries protoc 3.5, which refuses `optional`.
# A `*_pb2_grpc.py` only names the request and response classes of each method, so when that
# protoc is too old the stubs are generated from a copy of the protos with the `optional` labels
# removed: the stubs are the same, and the messages (with presence) still come from the real
# protos. A grpc_tools with protoc 3.15 or later (pip's grpcio-tools) reads the real protos.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
out=${1:-$here/berth_api}
python=${PYTHON:-/usr/bin/python3}
protoc=${PROTOC:-protoc}
proto="$root/proto"

die() { echo "generate.sh: $*" >&2; exit 1; }

command -v "$protoc" >/dev/null || die "$protoc not found: apt-get install protobuf-compiler (3.15 or later)"
"$python" -c 'import grpc_tools.protoc' 2>/dev/null || die "$python has no grpc_tools: apt-get install python3-grpc-tools"

# "libprotoc 3.21.12" -> 3021
version_number() { sed -E 's/^libprotoc ([0-9]+)\.([0-9]+).*/\1 \2/' | { read -r major minor; echo $((major * 1000 + minor)); }; }
[ "$("$protoc" --version | version_number)" -ge 3015 ] || die "$("$protoc" --version) is too old for proto3 'optional' (needs 3.15)"

# The well-known types (google/protobuf/*.proto) to compile against: the runtime ships their
# generated code, not always the .proto files. grpc_tools carries them.
wkt=$("$python" -c 'import grpc_tools, os; print(os.path.join(os.path.dirname(grpc_tools.__file__), "_proto"))')
includes=(-I "$proto" -I "$wkt")
[ -d /usr/include/google/protobuf ] && includes+=(-I /usr/include)

berth_protos=()
while IFS= read -r file; do berth_protos+=("$file"); done < <(cd "$proto" && find berth -name '*.proto' | sort)
service_protos=()
for file in "${berth_protos[@]}"; do grep -q '^service ' "$proto/$file" && service_protos+=("$file"); done

mkdir -p "$out"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# Messages, with type hints.
"$protoc" "${includes[@]}" --python_out="$out" --pyi_out="$out" "${berth_protos[@]}"

# Service stubs.
if [ "$("$python" -m grpc_tools.protoc --version | version_number)" -ge 3015 ]; then
  "$python" -m grpc_tools.protoc "${includes[@]}" --grpc_python_out="$out" "${service_protos[@]}"
else
  mkdir -p "$work/proto"
  cp -R "$proto/berth" "$work/proto/"
  find "$work/proto" -name '*.proto' -exec sed -i -E 's/^([[:space:]]*)optional[[:space:]]+/\1/' {} +
  mkdir -p "$work/out"
  "$python" -m grpc_tools.protoc -I "$work/proto" -I "$wkt" --grpc_python_out="$work/out" "${service_protos[@]}"
  (cd "$work/out" && find . -name '*_pb2_grpc.py' -exec cp --parents {} "$out/" \;)
fi

# grpc.health.v1, compiled as a top-level `health.proto`: generated at its own path it would make a
# `grpc/` folder that hides the grpcio module. The wire names (package grpc.health.v1) are the same.
"$protoc" -I "$proto/grpc/health/v1" --python_out="$out" --pyi_out="$out" health.proto
"$python" -m grpc_tools.protoc -I "$proto/grpc/health/v1" --grpc_python_out="$out" health.proto

# google.rpc's Status and error details (ErrorInfo, RetryInfo, BadRequest), which berth's errors
# carry in grpc-status-details-bin; compiled as top-level `status.proto` and `error_details.proto`
# for the same reason (a `google/` folder would hide the protobuf runtime's own `google` package).
"$protoc" -I "$proto/google/rpc" "${includes[@]}" --python_out="$out" --pyi_out="$out" status.proto error_details.proto

echo "generated Python stubs in $out"
