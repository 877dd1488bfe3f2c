#!/usr/bin/env bash
# MirrorMaker 2 (Kafka Connect's connect-mirror, dedicated mode), the peer of
# tools/bench/mirror.py, resolved from Maven Central with tools/kafka/mirrormaker-pom.xml
# (the same Kafka version as tools/kafka/pom.xml), as kafka.sh resolves the broker.
#
#   mirrormaker.sh fetch             resolve connect-mirror, connect-mirror-client and their
#                                    runtime dependencies into .cache/mirrormaker/lib
#   mirrormaker.sh classpath         print the Java classpath of the cached jars
#   mirrormaker.sh run MM2.PROPERTIES
#                                    run org.apache.kafka.connect.mirror.MirrorMaker
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
cache="${REPLICAD_MIRRORMAKER_CACHE:-$root/.cache/mirrormaker}"
lib="$cache/lib"
stamp="$lib/.fetched"
pom="$here/mirrormaker-pom.xml"
dependency_plugin="org.apache.maven.plugins:maven-dependency-plugin:3.6.1"

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
        echo "mirrormaker.sh: mvn not found (Debian package 'maven')" >&2
        exit 1
    }
    echo "mirrormaker.sh: resolving MirrorMaker 2 into $lib" >&2
    local staging="$cache/lib.partial.$$"
    rm -rf "$staging"
    mkdir -p "$cache"
    # Kafka's own local repository (.cache/kafka/m2) is shared: the jars both need are
    # downloaded once.
    if ! mvn --batch-mode --quiet --file "$pom" \
        -Dmaven.repo.local="$root/.cache/kafka/m2" \
        "$dependency_plugin:copy-dependencies" \
        -DincludeScope=runtime \
        -DoutputDirectory="$staging" >"$cache/mvn.log" 2>&1; then
        cat "$cache/mvn.log" >&2
        echo "mirrormaker.sh: resolving the MirrorMaker 2 jars failed (Maven's output above)" >&2
        exit 1
    fi
    rm -rf "$lib"
    mv "$staging" "$lib"
    pom_digest >"$stamp"
    echo "mirrormaker.sh: $(find "$lib" -name '*.jar' | wc -l) jars in $lib" >&2
}

classpath() {
    if ! is_cached; then
        echo "mirrormaker.sh: jars not fetched; run tools/kafka/mirrormaker.sh fetch" >&2
        exit 1
    fi
    find "$lib/" -maxdepth 1 -name '*.jar' | LC_ALL=C sort | paste -sd: -
}

run() {
    exec java ${MIRRORMAKER_HEAP:--Xmx1g} \
        -Dlog4j2.configurationFile="$here/log4j2-tools.properties" \
        -cp "$(classpath)" org.apache.kafka.connect.mirror.MirrorMaker "$@" 2>&1
}

case "${1:-}" in
fetch) fetch ;;
classpath) classpath ;;
run)
    [ $# -ge 2 ] || { echo "usage: mirrormaker.sh run MM2.PROPERTIES" >&2; exit 2; }
    shift
    run "$@"
    ;;
*)
    echo "usage: mirrormaker.sh fetch | classpath | run MM2.PROPERTIES" >&2
    exit 2
    ;;
esac
