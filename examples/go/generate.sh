#!/usr/bin/env bash
# Generates berth's Go stubs from proto/ into OUT_DIR (default: examples/go/gen).
#
#   examples/go/generate.sh [OUT_DIR]
#
# OUT_DIR then holds `berth/{sessions,locks,budget}/v1/*.pb.go` (messages) and `*_grpc.pb.go`
# (service clients), Go packages `sessionsv1`, `locksv1` and `budgetv1` imported as
# `<module>/gen/berth/<service>/v1`, where <module> is go.mod's module path (GO_IMPORT_PREFIX names
# another prefix than `<module>/gen`). grpc.health.v1 and google.rpc's status and error details are
# not generated: grpc-go and genproto ship them. Nothing generated is kept in git: proto/ is the
# source.
#
# berth's protos set no `go_package` (it names a Go import path, which is the user's to choose), so
# both plugins are told each file's package with an `M<file>=<import path>;<package>` option.
#
# Settings (environment): PROTOC (default protoc, 3.15 or later for proto3 `optional`),
# PROTOC_GEN_GO and PROTOC_GEN_GO_GRPC (default: on PATH; Debian's protoc-gen-go and
# protoc-gen-go-grpc), PROTO_INCLUDE (where google/protobuf/*.proto are; default /usr/include,
# Debian's libprotobuf-dev).
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
out=${1:-$here/gen}
protoc=${PROTOC:-protoc}
gen_go=${PROTOC_GEN_GO:-$(command -v protoc-gen-go || true)}
gen_go_grpc=${PROTOC_GEN_GO_GRPC:-$(command -v protoc-gen-go-grpc || true)}
wkt=${PROTO_INCLUDE:-/usr/include}
proto="$root/proto"
module=$(sed -n -E 's/^module[[:space:]]+([^[:space:]]+).*/\1/p' "$here/go.mod")
prefix=${GO_IMPORT_PREFIX:-$module/gen}

die() { echo "generate.sh: $*" >&2; exit 1; }

command -v "$protoc" >/dev/null || die "$protoc not found: apt-get install protobuf-compiler"
[ -n "$gen_go" ] && [ -x "$gen_go" ] || die "protoc-gen-go not found: apt-get install protoc-gen-go (or set PROTOC_GEN_GO)"
[ -n "$gen_go_grpc" ] && [ -x "$gen_go_grpc" ] || die "protoc-gen-go-grpc not found: apt-get install protoc-gen-go-grpc (or set PROTOC_GEN_GO_GRPC)"
[ -f "$wkt/google/protobuf/duration.proto" ] || die "no google/protobuf/*.proto in $wkt: apt-get install libprotobuf-dev (or set PROTO_INCLUDE)"

files=()
mappings=""
while IFS= read -r file; do
  files+=("$file")
  dir=$(dirname "$file")                         # berth/sessions/v1
  package=$(basename "$(dirname "$dir")")v1      # sessionsv1
  [ "$(basename "$dir")" = v1 ] || die "$file: only v1 packages are mapped (add the rule for $dir)"
  mappings+=",M$file=$prefix/$dir;$package"
done < <(cd "$proto" && find berth -name '*.proto' | sort)

mkdir -p "$out"
"$protoc" -I "$proto" -I "$wkt" \
  --plugin=protoc-gen-go="$gen_go" --go_out="$out" --go_opt="paths=source_relative$mappings" \
  --plugin=protoc-gen-go-grpc="$gen_go_grpc" --go-grpc_out="$out" --go-grpc_opt="paths=source_relative$mappings" \
  "${files[@]}"

echo "generated Go stubs in $out"
