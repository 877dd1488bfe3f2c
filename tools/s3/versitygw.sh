#!/usr/bin/env bash
# versitygw, the S3-compatible server the archive tests run (tools/peers/s3.py).
#
# Why this one: a real S3 server (not a mock of boto3), Apache-2.0 (MinIO and Garage are
# AGPL, which the project keeps out), written in Go and built from source by the Go
# toolchain through its module proxy -- no prebuilt binary is downloaded. Its `posix`
# backend stores each object as a plain file under a directory, so a test starts it in well
# under a second with nothing but a temporary directory.
#
#   versitygw.sh fetch   build the pinned version into .cache/versitygw/bin (once)
#   versitygw.sh path    print the binary's path
#
# The built binary is also kept per user, by version, in $REPLICAD_BIN_STORE (default
# ${XDG_CACHE_HOME:-~/.cache}/replicad/bin): a fresh clone copies it from there instead of
# running `go install` again (a link step of 10-20 s even with Go's caches warm).
# REPLICAD_BIN_STORE=none turns it off.
set -euo pipefail

VERSION=v1.8.0
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
cache="${REPLICAD_VERSITYGW_CACHE:-$root/.cache/versitygw}"
binary="$cache/bin/versitygw"
stamp="$cache/bin/.version"
store_base="${REPLICAD_BIN_STORE:-${XDG_CACHE_HOME:-${HOME:-/nonexistent}/.cache}/replicad/bin}"
stored="$store_base/versitygw-$VERSION"

case "${1:-}" in
fetch)
    if [ -x "$binary" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$VERSION" ]; then
        exit 0
    fi
    # Go's own tarball installs into /usr/local/go/bin, which a login shell's PATH of a user
    # who is not root often lacks: look there too before giving up.
    if ! command -v go >/dev/null && [ -x /usr/local/go/bin/go ]; then
        PATH="$PATH:/usr/local/go/bin"
    fi
    if ! command -v go >/dev/null; then
        echo "versitygw.sh: Go is needed to build versitygw (the archive tests' S3 server)" >&2
        exit 1
    fi
    mkdir -p "$cache/bin"
    if [ "$store_base" != none ] && [ -x "$stored" ]; then
        cp "$stored" "$binary.partial.$$" && mv "$binary.partial.$$" "$binary"
        echo "$VERSION" >"$stamp"
        echo "versitygw.sh: $VERSION from $stored" >&2
        exit 0
    fi
    # Go's own module and build caches: a rebuild after `make clean` takes seconds, not the
    # minutes of the first build (two cores: about 4 CPU-minutes).
    GOBIN="$cache/bin" go install "github.com/versity/versitygw/cmd/versitygw@$VERSION"
    echo "$VERSION" >"$stamp"
    # Kept for the next clone (best effort: a store that cannot be written is no error).
    if [ "$store_base" != none ]; then
        { mkdir -p "$store_base" && cp "$binary" "$stored.partial.$$" &&
            mv "$stored.partial.$$" "$stored"; } 2>/dev/null || rm -f "$stored.partial.$$"
    fi
    ;;
path)
    echo "$binary"
    ;;
*)
    echo "usage: $0 fetch|path" >&2
    exit 2
    ;;
esac
