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
    echo "jars.sh: resolving $(basename "$pom") into $lib" >&2
    local staging="$cache/lib.partial.$$"
    rm -rf "$staging"
    mkdir -p "$cache"
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
    # Swap in whole so an interrupted fetch never leaves a half-filled lib/.
    # Class-data-sharing archives (tools/peers/kafka.py) fit only the old jars.
    rm -rf "$lib" "$cache/cds"
    mv "$staging" "$lib"
    pom_digest >"$stamp"
    echo "jars.sh: $(find "$lib" -name '*.jar' | wc -l) jars in $lib" >&2
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
