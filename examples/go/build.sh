#!/usr/bin/env bash
# Builds the Go example offline, from Debian's packages only, into OUT_DIR (default:
# examples/go/build).
#
#   examples/go/build.sh [OUT_DIR]        # -> OUT_DIR/berth-go-demo
#
# OUT_DIR/module is the module as `go build` sees it: this folder's sources and go.mod, the stubs
# generate.sh makes from proto/ (gen/), and a vendor/ of symlinks into Debian's Go sources
# (/usr/share/gocode/src: golang-google-grpc-dev, golang-google-protobuf-dev,
# golang-github-golang-protobuf-1-5-dev, golang-google-genproto-dev and the golang.org/x packages
# they pull in). The build runs with GOFLAGS=-mod=vendor and GOPROXY=off: it never reaches the
# network, and the versions it builds are those go.mod names, which are Debian 12's. Nothing here is
# kept in git.
#
# Settings (environment): GO (default go), GOCODE (default /usr/share/gocode/src); generate.sh's
# settings pass through.
set -euo pipefail

here=$(cd "$(dirname "$0")" && pwd)
out=${1:-$here/build}
go=${GO:-go}
gocode=${GOCODE:-/usr/share/gocode/src}

die() { echo "build.sh: $*" >&2; exit 1; }
command -v "$go" >/dev/null || die "$go not found: apt-get install golang-go"

mkdir -p "$out"
out=$(cd "$out" && pwd)
module="$out/module"
rm -rf "$module"
mkdir -p "$module"
cp "$here/go.mod" "$module/"
(cd "$here" && find berth cmd -name '*.go' -exec cp --parents {} "$module/" \;)
"$here/generate.sh" "$module/gen" >/dev/null

# vendor/: one symlink per required module, and the modules.txt that lists each module (as go.mod
# requires it), its go version and the packages it provides.
mkdir -p "$module/vendor"
: >"$module/vendor/modules.txt"
while read -r path version; do
  [ -d "$gocode/$path" ] || die "$gocode/$path is missing: apt-get install golang-go golang-google-grpc-dev golang-google-protobuf-dev golang-github-golang-protobuf-1-5-dev golang-google-genproto-dev"
  mkdir -p "$module/vendor/$(dirname "$path")"
  ln -s "$gocode/$path" "$module/vendor/$path"
  goversion=$(sed -n -E 's/^go[[:space:]]+([0-9.]+).*/\1/p' "$gocode/$path/go.mod" 2>/dev/null | head -n1)
  {
    echo "# $path $version"
    echo "## explicit${goversion:+; go $goversion}"
    (cd "$gocode" && find -L "$path" -name '*.go' ! -name '*_test.go' ! -path '*/testdata/*' ! -path '*/internal/cmd/*' -printf '%h\n' | sort -u)
  } >>"$module/vendor/modules.txt"
done < <(sed -n -E 's/^[[:space:]]+([a-z0-9.-]+\.[a-z]+\/[^[:space:]]+)[[:space:]]+(v[^[:space:]]+).*/\1 \2/p' "$module/go.mod")

# -trimpath: the packages compile to the same cache entries whatever OUT_DIR is, so a second build
# elsewhere (another test's temporary folder) only links.
(cd "$module" && GOFLAGS=-mod=vendor GOPROXY=off GOSUMDB=off GOTOOLCHAIN=local GO111MODULE=on GOWORK=off \
  "$go" build -trimpath -o "$out/berth-go-demo" ./cmd/berth-go-demo)
echo "built $out/berth-go-demo"
