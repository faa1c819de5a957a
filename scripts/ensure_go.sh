#!/usr/bin/env bash
# Make sure Debian's Go toolchain for the Go front door (services/tiermesh/frontdoor) is
# here: `go`, `protoc`, `protoc-gen-go`, grpc-go's and redigo's sources under
# /usr/share/gocode (GOPATH mode: the build downloads nothing). Installs the missing Debian packages; used by
# `make test` (the front door's tests build and run it), `make frontdoor` and `make run`
# (which serves from the Python gateway alone where this fails).
set -euo pipefail
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=scripts/apt_install.sh
. "$here/apt_install.sh"
grpc_sources="${GOCODE:-/usr/share/gocode}/src/google.golang.org/grpc"
redigo_sources="${GOCODE:-/usr/share/gocode}/src/github.com/gomodule/redigo"
missing=()
command -v go >/dev/null 2>&1 || missing+=(golang-go)
command -v protoc >/dev/null 2>&1 || missing+=(protobuf-compiler)
command -v protoc-gen-go >/dev/null 2>&1 || missing+=(golang-goprotobuf-dev)
[ -d "$grpc_sources" ] || missing+=(golang-google-grpc-dev)
[ -d "$redigo_sources" ] || missing+=(golang-github-gomodule-redigo-dev)
if [ "${#missing[@]}" -eq 0 ]; then
  exit 0
fi
echo "the Go front door's toolchain is missing; installing Debian's ${missing[*]}..." >&2
for package in "${missing[@]}"; do
  if ! apt_install "$package"; then
    echo "error: no Go toolchain for the front door ($APT_WHY): apt-get install golang-go golang-google-grpc-dev golang-github-gomodule-redigo-dev golang-goprotobuf-dev protobuf-compiler, and run make again." >&2
    exit 1
  fi
done
