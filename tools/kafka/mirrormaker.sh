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
pom="$here/mirrormaker-pom.xml"

jars() {
    "$here/jars.sh" "$1" "$pom" "$cache"
}

run() {
    exec java ${MIRRORMAKER_HEAP:--Xmx1g} \
        -Dlog4j2.configurationFile="$here/log4j2-tools.properties" \
        -cp "$(jars classpath)" org.apache.kafka.connect.mirror.MirrorMaker "$@" 2>&1
}

case "${1:-}" in
fetch) jars fetch ;;
classpath) jars classpath ;;
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
