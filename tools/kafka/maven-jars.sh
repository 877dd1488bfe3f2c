# Resolving a pom's runtime jars from Maven Central into a cache, for kafka.sh,
# mirrormaker.sh and jars.sh (sourced, not run). The caller sets, before sourcing:
#   tool     its own name, for messages           pom    the pom whose jars it needs
#   cache    its cache directory (lib/ below it)  m2     Maven's local repository
#   what     what it resolves, for the log line   hint   how to fetch, for classpath's error
# and gets fetch (a quick no-op when cached) and classpath.

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
        echo "$tool: mvn not found (Debian package 'maven')" >&2
        exit 1
    }
    command -v java >/dev/null 2>&1 || {
        echo "$tool: java not found; Kafka 4 needs Java 17+ (Debian: openjdk-17-jre-headless)" >&2
        exit 1
    }
    echo "$tool: resolving $what into $lib" >&2
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
        echo "$tool: resolving the $what jars failed (Maven's output above)" >&2
        exit 1
    fi
    # Swap in whole so an interrupted fetch never leaves a half-filled lib/.
    # Class-data-sharing archives (tools/peers/kafka.py) fit only the old jars.
    rm -rf "$lib" "$cache/cds"
    mv "$staging" "$lib"
    pom_digest >"$stamp"
    echo "$tool: $(find "$lib" -name '*.jar' | wc -l) jars in $lib" >&2
}

classpath() {
    if ! is_cached; then
        echo "$tool: the jars of $(basename "$pom") are not in $lib (or are stale for the pom): run $hint" >&2
        exit 1
    fi
    find "$lib/" -maxdepth 1 -name '*.jar' | LC_ALL=C sort | paste -sd: -
}
