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
pom="$here/pom.xml"

jars() {
    "$here/jars.sh" "$1" "$pom" "$cache"
}

version() {
    sed -n 's:.*<kafka.version>\(.*\)</kafka.version>.*:\1:p' "$pom"
}

run() {
    local main_class="$1"
    shift
    exec java -Xmx512m \
        -Dlog4j2.configurationFile="$here/log4j2-tools.properties" \
        -cp "$(jars classpath)" "$main_class" "$@"
}

case "${1:-}" in
fetch) jars fetch ;;
classpath) jars classpath ;;
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
