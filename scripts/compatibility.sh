#!/usr/bin/env bash
# The supported Kubernetes range, measured: for each release of scripts/lib/versions.sh, builds
# its control plane from Go modules (cached per version; scripts/install-control-plane.sh) and
# runs the real tier on it (scripts/real-tier.sh: the chart judged and installed by that API
# server, then the user stories and the e2e scenarios), and prints a table of what passed.
#
#   scripts/compatibility.sh                      # every release, stories and scenarios
#   scripts/compatibility.sh --stories 1.32       # the oldest, the user stories only (CI)
#   scripts/compatibility.sh 1.35 1.36            # some releases
#
# The table (markdown) goes to standard output and to target/compatibility/table.md, each
# release's log to target/compatibility/<version>.log. Exits 1 when any cell failed. A release
# runs alone on the machine's ports: they are run one after the other.
set -euo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$HERE/.." && pwd)"
# shellcheck source=lib/versions.sh
. "$HERE/lib/versions.sh"
OUT="$ROOT/target/compatibility"

say() { echo "compatibility.sh: $*" >&2; }

stories_only=false
versions=()
for arg in "$@"; do
    case "$arg" in
    --stories) stories_only=true ;;
    -h | --help)
        sed -n '2,13p' "$0"
        exit 0
        ;;
    *) versions+=("$(CONFIGHASH_KUBERNETES_VERSION="$arg" kubernetes_version)") || exit 2 ;;
    esac
done
[ ${#versions[@]} -gt 0 ] || versions=("${KUBERNETES_VERSIONS[@]}")
mkdir -p "$OUT"

# "passed/run" of the test names matching $2 in the log $1 (libtest's "test NAME ... ok").
count() {
    local passed run
    run=$(grep -cE "^test $2.* \.\.\. (ok|FAILED)$" "$1" || true)
    passed=$(grep -cE "^test $2.* \.\.\. ok$" "$1" || true)
    echo "$passed/$run"
}

rows=()
failed=0
for v in "${versions[@]}"; do
    log="$OUT/$v.log"
    say "Kubernetes $v: building and running (log: $log)"
    began=$SECONDS
    args=()
    $stories_only && args=(-- stories::)
    status=0
    CONFIGHASH_KUBERNETES_VERSION="$v" CONFIGHASH_CONTROL_PLANE_DIR="$OUT/$v-state" \
        "$HERE/real-tier.sh" "${args[@]}" >"$log" 2>&1 || status=$?
    took=$((SECONDS - began))
    stories=$(count "$log" "stories::")
    if $stories_only; then
        scenarios="not run"
    else
        all=$(count "$log" "")
        scenarios="$(( ${all%/*} - ${stories%/*} ))/$(( ${all#*/} - ${stories#*/} ))"
    fi
    server=$(sed -n 's/.*kube-apiserver reports \(v[0-9.]*\).*/\1/p' "$log" | head -1)
    if [ "$status" -eq 0 ]; then result=pass; else result="FAIL (exit $status)"; failed=1; fi
    # A run that built or judged nothing has no stories: that is a failure too.
    [ "${stories#*/}" != 0 ] || { result="FAIL (no stories ran)"; failed=1; }
    rows+=("| $v | ${server:-?} | $stories | $scenarios | $result | $took s |")
    say "Kubernetes $v: $result in $took s (stories $stories, scenarios $scenarios)"
done

{
    echo "| Kubernetes | kube-apiserver reports | user stories passed | e2e scenarios passed | result | wall time |"
    echo "|---|---|---|---|---|---|"
    printf '%s\n' "${rows[@]}"
} | tee "$OUT/table.md"
exit "$failed"
