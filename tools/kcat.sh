#!/usr/bin/env bash
# kcat (the librdkafka command-line client) for the tests, which use it as a real peer.
# It is not on PyPI or Maven Central, so it comes from Debian's packages:
#
#   kcat.sh fetch   kcat on PATH already: nothing to do. As root: apt-get install kcat.
#                   As anyone else: apt-get download kcat and the libraries it needs that
#                   the system lacks, and unpack them (dpkg -x) into .cache/kcat -- no root.
#                   When the system's package lists cannot give them (empty, as in a fresh
#                   container, or stale), package lists of our own are fetched into
#                   .cache/apt first (apt-get update with Dir::State::Lists there): that
#                   needs no root either.
#   kcat.sh path    print the kcat to run (on PATH, or .cache/kcat/bin/kcat)
#
# Only `make test` needs kcat; `make demo` does not.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/.." && pwd)"
cache="$root/.cache/kcat"
wrapper="$cache/bin/kcat"
own_apt="$root/.cache/apt"
# apt options for package lists of our own, in a directory this user may write.
own_lists=(-o "Dir::State::Lists=$own_apt/lists" -o "Dir::Cache=$own_apt/cache")

installed() {
    [ "$(dpkg-query -W -f='${Status}' "$1" 2>/dev/null)" = "install ok installed" ]
}

# kcat and every package it needs, recursively, that the system has not installed.
wanted() {
    local package
    apt-cache "$@" depends --recurse --no-recommends --no-suggests --no-conflicts \
        --no-breaks --no-replaces --no-enhances kcat | grep -v '^[ <]' | sort -u |
        while read -r package; do
            if [ "$package" = kcat ] || ! installed "$package"; then
                echo "$package"
            fi
        done
}

# download STAGING [APT OPTIONS...]: the .deb files of `wanted` into STAGING/debs.
download() {
    local staging="$1"
    shift
    local packages
    packages="$(wanted "$@")" || return 1
    [ -n "$packages" ] || return 1
    # shellcheck disable=SC2086 # one package name a word
    (cd "$staging/debs" && apt-get -q "$@" download $packages)
}

works() {
    "$1" -V >/dev/null 2>&1
}

path() {
    if command -v kcat >/dev/null 2>&1; then
        command -v kcat
    elif [ -x "$wrapper" ]; then
        echo "$wrapper"
    else
        return 1
    fi
}

fetch() {
    if found="$(path)" && works "$found"; then
        return 0
    fi
    if ! command -v apt-get >/dev/null 2>&1; then
        echo "kcat.sh: kcat is missing and this is not a Debian-like system; install kcat" \
            "(e.g. brew install kcat) and run make test again" >&2
        exit 1
    fi
    if [ "$(id -u)" -eq 0 ]; then
        echo "kcat.sh: installing kcat (apt-get)" >&2
        export DEBIAN_FRONTEND=noninteractive
        apt-get update -qq
        apt-get install -y -qq kcat >/dev/null
        return 0
    fi
    echo "kcat.sh: fetching kcat into $cache (apt-get download, no root needed)" >&2
    local staging="$cache.partial.$$"
    rm -rf "$staging"
    mkdir -p "$staging/debs" "$staging/root" "$staging/bin"
    if ! download "$staging" >"$staging/apt.log" 2>&1; then
        echo "kcat.sh: the system's package lists do not have it; fetching package lists" \
            "into $own_apt (no root needed)" >&2
        mkdir -p "$own_apt/lists/partial" "$own_apt/cache/archives/partial"
        if ! { apt-get -q "${own_lists[@]}" update && download "$staging" "${own_lists[@]}"; } \
            >>"$staging/apt.log" 2>&1; then
            cat "$staging/apt.log" >&2
            rm -rf "$staging"
            echo "kcat.sh: could not download kcat (no network to the package archive?)." >&2
            echo "kcat.sh: run:  sudo apt-get update && sudo apt-get install kcat" >&2
            echo "kcat.sh: then run make test again." >&2
            exit 1
        fi
    fi
    for deb in "$staging"/debs/*.deb; do
        dpkg -x "$deb" "$staging/root"
    done
    local libs
    libs="$(find "$staging/root" -name 'lib*.so*' -printf '%h\n' | sort -u | tr '\n' ':')"
    libs="${libs//$staging/$cache}"
    cat >"$staging/bin/kcat" <<WRAPPER
#!/bin/sh
# kcat unpacked from Debian's package by tools/kcat.sh, with its own libraries.
LD_LIBRARY_PATH="$libs\${LD_LIBRARY_PATH:-}" exec "$cache/root/usr/bin/kcat" "\$@"
WRAPPER
    chmod +x "$staging/bin/kcat"
    rm -rf "$cache" "$staging/debs" "$staging/apt.log"
    mv "$staging" "$cache"
    works "$wrapper" || {
        echo "kcat.sh: the unpacked kcat does not run: $("$wrapper" -V 2>&1 | head -3)" >&2
        exit 1
    }
    echo "kcat.sh: $("$wrapper" -V 2>&1 | head -1)" >&2
}

case "${1:-}" in
fetch) fetch ;;
path) path ;;
*)
    echo "usage: $0 fetch|path" >&2
    exit 2
    ;;
esac
