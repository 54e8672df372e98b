#!/usr/bin/env bash
# Refreshes the etcd v3 API contracts in this folder from Debian's golang-etcd-server-dev (etcd's
# own source, the same release as the etcd-server package berth tests against), then regenerates
# the TypeScript: `bash packages/etcd/proto/vendor.sh` from the repository root.
#
# The files are etcd's, byte for byte, but for two kinds of options that only etcd's Go build reads
# and that would need protos from elsewhere: gogoproto (Go code generation) and google.api.http
# (etcd's JSON gateway routes). Neither changes a field, a number or a method, so the wire is etcd's.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
(cd "$work" && apt-get download golang-etcd-server-dev >/dev/null 2> >(grep -v "unsandboxed as root" >&2) && dpkg -x golang-etcd-server-dev_*.deb root)
src="$work/root/usr/share/gocode/src/go.etcd.io/etcd"
for file in mvcc/mvccpb/kv.proto auth/authpb/auth.proto etcdserver/etcdserverpb/rpc.proto; do
  mkdir -p "$here/etcd/$(dirname "$file")"
  perl -0pe '
    s/^import "(gogoproto\/gogo|google\/api\/annotations)\.proto";\n//mg;
    s/^option \(gogoproto\.[^;]*;\n//mg;
    s/\{\s*option \(google\.api\.http\) = (\{(?:[^{}]++|(?1))*\});\s*\}/{}/g;
  ' "$src/$file" >"$here/etcd/$file"
done
dpkg-deb -f "$work"/golang-etcd-server-dev_*.deb Version >"$here/VERSION"
cd "$here/../../.." && npx buf generate packages/etcd --template packages/etcd/buf.gen.yaml
