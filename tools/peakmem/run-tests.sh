#!/bin/sh
# CI entry point for the peakmem tooling module: prepares the patched GoMLX copy, then runs this module's tests,
# which compare memory.SimulatePeak with the real buffer-pool counter. Extra arguments go to `go test`
# (e.g. ./run-tests.sh -run MLP).
set -eu
cd "$(dirname "$0")"
./setup.sh
# -mod=mod: go.sum may need entries for requirements memfit's go.mod gained since this module's go.sum was written.
GOFLAGS="${GOFLAGS:-} -mod=mod" GOWORK=off go vet ./...
GOFLAGS="${GOFLAGS:-} -mod=mod" GOWORK=off go test -count=1 -v "$@" ./...
