#!/bin/sh
# Copies github.com/gomlx/compute v0.1.14 (the module that holds GoMLX v0.28.16's backends) from the Go module cache
# into third_party/compute (git-ignored) and applies compute-pool-counter.patch, so that this module (see go.mod's
# replace) builds against a Go backend whose buffer pool counts live and peak bytes. Idempotent: a stamp records
# the compute version and the patch's hash, and the copy is only redone when either changes. Needs go and git (or
# patch).
set -eu

COMPUTE_VERSION=v0.1.14
here=$(cd "$(dirname "$0")" && pwd)
dest="$here/third_party/compute"
patchfile="$here/compute-pool-counter.patch"
stampfile="$dest/.memfit-peakmem-stamp"

patchsum=$(cksum < "$patchfile")
stamp="compute $COMPUTE_VERSION patch $patchsum"
if [ -f "$stampfile" ] && [ "$(cat "$stampfile")" = "$stamp" ]; then
	echo "peakmem: $dest is up to date ($COMPUTE_VERSION + pool counter)"
	exit 0
fi

# Ask the go command for the module's directory in the cache (downloading it if needed). Run it outside any
# module: here, go.mod's replace points at the copy this script is about to make.
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
src=$(cd "$tmp" && GOFLAGS=-mod=mod GOWORK=off go mod download -json "github.com/gomlx/compute@$COMPUTE_VERSION" |
	sed -n 's/^[[:space:]]*"Dir": "\(.*\)",\{0,1\}$/\1/p')
if [ -z "$src" ] || [ ! -d "$src" ]; then
	echo "peakmem: could not locate github.com/gomlx/compute@$COMPUTE_VERSION in the module cache" >&2
	exit 1
fi

rm -rf "$dest"
mkdir -p "$dest"
(cd "$src" && tar --exclude=./docs -cf - .) | (cd "$dest" && tar -xf -)
chmod -R u+w "$dest"

# git apply must not see the enclosing memfit repository (it would resolve the patch's paths against its root):
# stop its repository discovery above the copy.
if command -v git >/dev/null 2>&1; then
	(cd "$dest" && GIT_CEILING_DIRECTORIES="$(dirname "$dest")" git apply --whitespace=nowarn "$patchfile")
elif command -v patch >/dev/null 2>&1; then
	(cd "$dest" && patch -p1 --forward --quiet < "$patchfile")
else
	echo "peakmem: need git or patch to apply $patchfile" >&2
	exit 1
fi
# Some upstream files are not gofmt-clean; format the copy so that `gofmt -l .` over the memfit checkout (which
# walks this git-ignored directory too) stays empty. Formatting changes no code.
gofmt -w "$dest"
echo "$stamp" > "$stampfile"
echo "peakmem: copied github.com/gomlx/compute $COMPUTE_VERSION from $src to $dest and applied the pool counter patch"
