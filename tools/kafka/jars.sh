#!/usr/bin/env bash
# The runtime jars a Maven pom names, resolved from Maven Central into a cache directory of
# their own: the shape kafka.sh and mirrormaker.sh keep for their peers, for any pom.
#
#   jars.sh fetch POM CACHE       resolve POM's runtime dependencies into CACHE/lib (a quick
#                                 no-op when CACHE/lib was fetched for this very pom)
#   jars.sh classpath POM CACHE   print those jars, ':'-separated; exit 1 when not fetched
#
# Used for Spark's Kafka source (tools/kafka/spark-kafka-pom.xml, `make spark-kafka-jars`).
# Maven's local repository is Kafka's (.cache/kafka/m2), so jars both need come down once.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
dependency_plugin="org.apache.maven.plugins:maven-dependency-plugin:3.6.1"

usage() {
    echo "usage: jars.sh fetch|classpath POM CACHE" >&2
    exit 2
}

[ $# -eq 3 ] || usage
[ -f "$2" ] || { echo "jars.sh: no pom at $2" >&2; exit 2; }
command="$1"
# Absolute: Maven resolves a relative output directory against the pom's own.
pom="$(realpath "$2")"
cache="$(realpath -m "$3")"
lib="$cache/lib"
stamp="$lib/.fetched"

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
    echo "jars.sh: resolving $(basename "$pom") into $lib" >&2
    local staging="$cache/lib.partial.$$"
    rm -rf "$staging"
    mkdir -p "$cache"
    if ! mvn --batch-mode --quiet --file "$pom" \
        -Dmaven.repo.local="${REPLICAD_KAFKA_CACHE:-$root/.cache/kafka}/m2" \
        "$dependency_plugin:copy-dependencies" \
        -DincludeScope=runtime \
        -DoutputDirectory="$staging" >"$cache/mvn.log" 2>&1; then
        cat "$cache/mvn.log" >&2
        echo "jars.sh: resolving $(basename "$pom") failed (Maven's output above)" >&2
        exit 1
    fi
    # Swapped in whole, so an interrupted fetch never leaves a half-filled lib/.
    rm -rf "$lib"
    mv "$staging" "$lib"
    pom_digest >"$stamp"
    echo "jars.sh: $(find "$lib" -name '*.jar' | wc -l) jars in $lib" >&2
}

classpath() {
    if ! is_cached; then
        echo "jars.sh: $(basename "$pom")'s jars are not in $lib (or are stale for the pom): run tools/kafka/jars.sh fetch $pom $cache" >&2
        exit 1
    fi
    find "$lib/" -maxdepth 1 -name '*.jar' | LC_ALL=C sort | paste -sd: -
}

case "$command" in
fetch) fetch ;;
classpath) classpath ;;
*) usage ;;
esac
