#!/usr/bin/env bash
# The runtime jars a Maven pom names, resolved from Maven Central into a cache directory of
# their own: the one place the project fetches jars (kafka.sh's broker and tools,
# mirrormaker.sh's MirrorMaker 2, Spark's Kafka source with tools/kafka/spark-kafka-pom.xml).
#
#   jars.sh fetch POM CACHE       resolve POM's runtime dependencies into CACHE/lib (a quick
#                                 no-op when CACHE/lib was fetched for this very pom)
#   jars.sh classpath POM CACHE   print those jars, ':'-separated; exit 1 when not fetched
#
# Maven's local repository is Kafka's (.cache/kafka/m2, or $REPLICAD_KAFKA_CACHE/m2), so
# jars several poms need come down once.
#
# A copy of each pom's resolved jars is also kept per user, by the pom's digest, in
# $REPLICAD_JAR_STORE (default ${XDG_CACHE_HOME:-~/.cache}/replicad/jars/<digest>): a fresh
# clone of the same pom copies them from there instead of running Maven again (a Maven run
# is 10-40 s even with its repository warm; a first clone still resolves from Maven Central).
# REPLICAD_JAR_STORE=none turns it off.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"

usage() {
    echo "usage: jars.sh fetch|classpath POM CACHE" >&2
    exit 2
}

[ $# -eq 3 ] || usage
[ -f "$2" ] || { echo "jars.sh: no pom at $2" >&2; exit 2; }
command="$1"
# Absolute: Maven resolves a relative output directory against the pom's own.
pom="$(realpath "$2")"
# Absolute, links kept: kafka.sh's classpath keys the JVMs' class-data-sharing archives.
case "$3" in
/*) cache="$3" ;;
*) cache="$PWD/$3" ;;
esac
m2="${REPLICAD_KAFKA_CACHE:-$root/.cache/kafka}/m2"
lib="$cache/lib"
stamp="$lib/.fetched"
# Pinned so a fresh clone resolves the same way as this one did.
dependency_plugin="org.apache.maven.plugins:maven-dependency-plugin:3.6.1"

# The cache is valid for exactly one pom: any edit of the pom refetches.
pom_digest() {
    sha256sum "$pom" | cut -d' ' -f1
}

is_cached() {
    [ -f "$stamp" ] && [ "$(cat "$stamp")" = "$(pom_digest)" ]
}

# The user's store of this pom's jars (empty: none).
store_dir() {
    local base="${REPLICAD_JAR_STORE:-${XDG_CACHE_HOME:-${HOME:-/nonexistent}/.cache}/replicad/jars}"
    [ "$base" = none ] || echo "$base/$(pom_digest)"
}

# Fill STAGING from the store; fails (and leaves nothing to use) when the store lacks it.
from_store() {
    local staging="$1" store
    store="$(store_dir)"
    [ -n "$store" ] && [ -f "$store/.fetched" ] || return 1
    [ "$(cat "$store/.fetched")" = "$(pom_digest)" ] || return 1
    mkdir -p "$staging"
    # Hard links when the store is on the same file system (no copy), else a copy.
    cp -l "$store"/*.jar "$staging"/ 2>/dev/null || cp "$store"/*.jar "$staging"/
}

# Keep LIB's jars in the store for the next clone (best effort: a store that cannot be
# written is no error, the jars are in LIB).
to_store() {
    local store partial
    store="$(store_dir)"
    [ -n "$store" ] && [ ! -f "$store/.fetched" ] || return 0
    partial="$store.partial.$$"
    {
        rm -rf "$partial" && mkdir -p "$partial" && cp "$lib"/*.jar "$partial"/ &&
            pom_digest >"$partial/.fetched" && rm -rf "$store" && mv "$partial" "$store"
    } 2>/dev/null || rm -rf "$partial"
}

fetch() {
    if is_cached; then
        return 0
    fi
    command -v mvn >/dev/null 2>&1 || {
        echo "jars.sh: mvn not found (Debian package 'maven')" >&2
        exit 1
    }
    command -v java >/dev/null 2>&1 || {
        echo "jars.sh: java not found; Kafka 4 needs Java 17+ (Debian: openjdk-17-jre-headless)" >&2
        exit 1
    }
    local staging="$cache/lib.partial.$$"
    rm -rf "$staging"
    mkdir -p "$cache"
    if from_store "$staging"; then
        swap_in "$staging"
        echo "jars.sh: $(find "$lib" -name '*.jar' | wc -l) jars of $(basename "$pom") from $(store_dir)" >&2
        return 0
    fi
    rm -rf "$staging"
    echo "jars.sh: resolving $(basename "$pom") into $lib" >&2
    # Maven's output is kept for when it fails; on success it is noise.
    if ! mvn --batch-mode --quiet --file "$pom" \
        -Dmaven.repo.local="$m2" \
        "$dependency_plugin:copy-dependencies" \
        -DincludeScope=runtime \
        -DoutputDirectory="$staging" >"$cache/mvn.log" 2>&1; then
        cat "$cache/mvn.log" >&2
        echo "jars.sh: resolving $(basename "$pom") failed (Maven's output above)" >&2
        exit 1
    fi
    swap_in "$staging"
    to_store
    echo "jars.sh: $(find "$lib" -name '*.jar' | wc -l) jars in $lib" >&2
}

swap_in() {
    # Swap in whole so an interrupted fetch never leaves a half-filled lib/.
    # Class-data-sharing archives (tools/peers/kafka.py) fit only the old jars.
    rm -rf "$lib" "$cache/cds"
    mv "$1" "$lib"
    pom_digest >"$stamp"
}

classpath() {
    if ! is_cached; then
        echo "jars.sh: the jars of $(basename "$pom") are not in $lib (or are stale for the pom): run tools/kafka/jars.sh fetch $pom $cache" >&2
        exit 1
    fi
    find "$lib/" -maxdepth 1 -name '*.jar' | LC_ALL=C sort | paste -sd: -
}

case "$command" in
fetch) fetch ;;
classpath) classpath ;;
*) usage ;;
esac
