#!/usr/bin/env bash
# The Apache Kafka jars the tests use as a real peer, resolved from Maven Central
# with tools/kafka/pom.xml (the Kafka version is pinned there).
#
#   kafka.sh fetch            resolve the broker, kafka-tools and their runtime
#                             dependencies into .cache/kafka/lib (quick no-op when cached)
#   kafka.sh classpath        print the Java classpath of the cached jars
#   kafka.sh version          print the pinned Kafka version
#   kafka.sh run CLASS ARGS   run any Kafka main class on that classpath, e.g.
#                             kafka.sh run kafka.tools.DumpLogSegments --files X.log
#
# The broker itself is started by tools/peers/kafka.py (KafkaBroker), which
# writes its config, formats KRaft storage and picks free ports.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
cache="${REPLICAD_KAFKA_CACHE:-$root/.cache/kafka}"
lib="$cache/lib"
stamp="$lib/.fetched"
pom="$here/pom.xml"
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
        echo "kafka.sh: mvn not found (Debian package 'maven')" >&2
        exit 1
    }
    command -v java >/dev/null 2>&1 || {
        echo "kafka.sh: java not found; Kafka 4 needs Java 17+ (Debian: openjdk-17-jre-headless)" >&2
        exit 1
    }
    echo "kafka.sh: resolving Apache Kafka $(version) into $lib" >&2
    # A private local repository keeps everything this project downloads under .cache/.
    local staging="$cache/lib.partial.$$"
    rm -rf "$staging"
    mkdir -p "$cache"
    # Maven's output is kept for when it fails; on success it is noise.
    if ! mvn --batch-mode --quiet --file "$pom" \
        -Dmaven.repo.local="$cache/m2" \
        "$dependency_plugin:copy-dependencies" \
        -DincludeScope=runtime \
        -DoutputDirectory="$staging" >"$cache/mvn.log" 2>&1; then
        cat "$cache/mvn.log" >&2
        echo "kafka.sh: resolving the Kafka jars failed (Maven's output above)" >&2
        exit 1
    fi
    # Swap in whole so an interrupted fetch never leaves a half-filled lib/.
    # Class-data-sharing archives (tools/peers/kafka.py) fit only the old jars.
    rm -rf "$lib" "$cache/cds"
    mv "$staging" "$lib"
    pom_digest >"$stamp"
    echo "kafka.sh: $(find "$lib" -name '*.jar' | wc -l) jars in $lib" >&2
}

classpath() {
    if ! is_cached; then
        echo "kafka.sh: Kafka jars not fetched; run 'make kafka-jars' (or tools/kafka/kafka.sh fetch)" >&2
        exit 1
    fi
    find "$lib/" -maxdepth 1 -name '*.jar' | LC_ALL=C sort | paste -sd: -
}

version() {
    sed -n 's:.*<kafka.version>\(.*\)</kafka.version>.*:\1:p' "$pom"
}

run() {
    local main_class="$1"
    shift
    exec java -Xmx512m \
        -Dlog4j2.configurationFile="$here/log4j2-tools.properties" \
        -cp "$(classpath)" "$main_class" "$@"
}

case "${1:-}" in
fetch) fetch ;;
classpath) classpath ;;
version) version ;;
run)
    [ $# -ge 2 ] || { echo "usage: kafka.sh run CLASS [ARGS...]" >&2; exit 2; }
    shift
    run "$@"
    ;;
*)
    echo "usage: kafka.sh fetch | classpath | version | run CLASS [ARGS...]" >&2
    exit 2
    ;;
esac
