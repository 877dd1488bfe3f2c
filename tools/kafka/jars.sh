#!/usr/bin/env bash
# The runtime jars a Maven pom names, resolved from Maven Central into a cache directory of
# their own, for any pom: the fetch kafka.sh and mirrormaker.sh use (maven-jars.sh).
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
tool=jars.sh
m2="${REPLICAD_KAFKA_CACHE:-$root/.cache/kafka}/m2"
what="$(basename "$pom")"
hint="tools/kafka/jars.sh fetch $pom $cache"
# shellcheck source=tools/kafka/maven-jars.sh
source "$here/maven-jars.sh"

case "$command" in
fetch) fetch ;;
classpath) classpath ;;
*) usage ;;
esac
