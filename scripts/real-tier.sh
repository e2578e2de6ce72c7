#!/usr/bin/env bash
# The real tier: confighash as a user runs it, on a real Kubernetes control plane.
#
#   scripts/real-tier.sh              # build, start, install, run the e2e scenarios, stop
#   scripts/real-tier.sh -- --test-threads 1 some_test   # arguments for the test binaries
#
# 1. Builds (or reuses) the control plane (scripts/install-control-plane.sh) and helm
#    (scripts/install-helm.sh), and starts the control plane (scripts/control-plane.sh).
# 2. Has the real API server judge the chart: the quick start's values, the single-node values,
#    the cert-manager values (with cert-manager's CRDs applied, no controller) and the scenarios'
#    configured workload kinds (tests/data/crds/kinds.json) are rendered
#    with helm and applied with `kubectl apply --server-side --dry-run=server`; then the quick
#    start's install with `webhook.url` (development: nothing reaches a Service without
#    kube-proxy) and those workload kinds is applied for real.
# 3. Runs `confighash serve` as a local process, with the chart's own arguments, authenticated
#    as the chart's ServiceAccount with a token from the TokenRequest API: the chart's RBAC is
#    exactly what it gets. It makes its certificate (with --self-signed-name 127.0.0.1) and writes
#    the caBundle into the chart's MutatingWebhookConfiguration, which the API server calls.
# 3a. Checks that the pinned kubectl reads the YAML corpus of tests/data/yaml11 as the golden
#    file that `cargo test` holds `stamp` to says (scripts/yaml-golden.py --check).
# 4. Runs the e2e scenarios and the user stories against it (CONFIGHASH_E2E_KUBECONFIG), counting
#    rollouts from the revisions the cluster keeps and confighash's writes from the API server's
#    audit log, and writes the stories' table ($STATE/user-stories.md; docs/user-stories.md is a
#    copy).
#
# Fails (never skips) when something it needs cannot be had. Environment: CONFIGHASH_TOOLS (the
# cache), CONFIGHASH_KUBERNETES_VERSION (a release of scripts/lib/versions.sh; the newest by
# default), CONFIGHASH_CONTROL_PLANE_DIR, CONFIGHASH_CP_PORT_BASE (see control-plane.sh),
# CONFIGHASH_REAL_KEEP=1 leaves the control plane and confighash running at the end.
set -euo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$HERE/.." && pwd)"
export CONFIGHASH_CONTROL_PLANE_DIR="${CONFIGHASH_CONTROL_PLANE_DIR:-$ROOT/target/control-plane}"
STATE="$CONFIGHASH_CONTROL_PLANE_DIR"
BASE="${CONFIGHASH_CP_PORT_BASE:-24700}"
WEBHOOK_PORT=$((BASE + 10))
ADMIN_PORT=$((BASE + 11))
NAMESPACE=confighash
RELEASE=confighash
CERT_MANAGER_VERSION=v1.16.5
# The e2e scenarios' change window (crates/testkit/src/e2e/support.rs WINDOW), and a flap threshold no
# barrier reaches (FLAP_THRESHOLD there): a barrier changes its ConfigMap many times a minute.
DEBOUNCE=400ms
FLAP_THRESHOLD=10000

say() { echo "real-tier.sh: $*" >&2; }
fail() {
    say "$*"
    exit 1
}
began=$SECONDS
phase_began=$SECONDS
phase() {
    say "$1 ($((SECONDS - phase_began)) s)"
    phase_began=$SECONDS
}

test_args=()
if [ "${1:-}" = "--" ]; then
    shift
    test_args=("$@")
elif [ $# -gt 0 ]; then
    fail "usage: scripts/real-tier.sh [-- TEST-ARGS...]"
fi

for tool in go cargo openssl curl python3 flock; do
    command -v "$tool" >/dev/null || fail "$tool is needed for the real tier and is not on PATH"
done

BIN=$("$HERE/install-control-plane.sh") || fail "scripts/install-control-plane.sh failed"
HELM=$("$HERE/install-helm.sh") || fail "scripts/install-helm.sh failed"
KUBECTL=("$BIN/kubectl" --kubeconfig "$STATE/admin.kubeconfig")
phase "tools ready: $BIN"

# The release build, as a user runs it (.ci/run has built it already for the demo).
(cd "$ROOT" && cargo build --release --locked --bin confighash) || fail "cargo build --release failed"
(cd "$ROOT" && cargo test --locked --no-run --test e2e) >/dev/null 2>&1 ||
    (cd "$ROOT" && cargo test --locked --no-run --test e2e) ||
    fail "building the e2e tests failed"
CONFIGHASH="$ROOT/target/release/confighash"
phase "confighash and the e2e tests built"

cleanup() {
    local rc=$?
    if [ "${CONFIGHASH_REAL_KEEP:-}" = 1 ]; then
        say "left running (CONFIGHASH_REAL_KEEP=1): confighash ($STATE/serve.sh stop 0); eval \"\$(scripts/control-plane.sh env)\""
        exit "$rc"
    fi
    local pidfile
    for pidfile in "$STATE"/confighash-*.pid; do
        [ -f "$pidfile" ] || continue
        "$STATE/serve.sh" stop "$(basename "$pidfile" .pid | sed 's/^confighash-//')" || true
    done
    "$HERE/control-plane.sh" down || true
    exit "$rc"
}
trap cleanup EXIT
"$HERE/control-plane.sh" up
server_version=$("${KUBECTL[@]}" version -o json | python3 -c 'import json,sys; print(json.load(sys.stdin)["serverVersion"]["gitVersion"])') ||
    fail "kube-apiserver did not say its version"
phase "control plane up: kube-apiserver reports $server_version"

# stamp reads YAML as this kubectl does: its reading of the corpus must be the committed one. An
# older release's control plane has the newest kubectl (scripts/install-control-plane.sh), whose
# reading the newest's run checks.
# shellcheck source=lib/versions.sh
. "$HERE/lib/versions.sh"
if [ "$(kubernetes_version)" = "$KUBERNETES_NEWEST" ]; then
    python3 "$HERE/yaml-golden.py" "$BIN/kubectl" "$STATE/admin.kubeconfig" --check --stamp "$CONFIGHASH" ||
        fail "kubectl reads tests/data/yaml11/cases.json otherwise than tests/data/yaml11/golden.json says (scripts/yaml-golden.py)"
    phase "kubectl's YAML reading checked"
fi

# --- the chart, judged by the real API server ---
render() { # values...
    "$HELM" template "$RELEASE" "$ROOT/charts/confighash" --namespace "$NAMESPACE" "$@"
}
"${KUBECTL[@]}" create namespace "$NAMESPACE" >/dev/null
"${KUBECTL[@]}" label namespace "$NAMESPACE" pod-security.kubernetes.io/enforce=restricted >/dev/null

# cert-manager's CRDs from its Go module (the CRD files there carry Helm comments and labels
# made of template text: those labels are dropped).
crds_dir=$(cd "$STATE" && GOFLAGS= go mod download -json \
    "github.com/cert-manager/cert-manager@$CERT_MANAGER_VERSION" | python3 -c 'import json,sys; print(json.load(sys.stdin)["Dir"])') ||
    fail "could not download github.com/cert-manager/cert-manager@$CERT_MANAGER_VERSION from the Go module proxy"
for crd in certificates issuers clusterissuers certificaterequests; do
    sed -e "/'{{.*}}'/d" "$crds_dir/deploy/crds/crd-$crd.yaml"
    echo "---"
done | "${KUBECTL[@]}" apply --server-side -f - >/dev/null || fail "cert-manager's CRDs do not apply"
"${KUBECTL[@]}" wait --for condition=Established crd/certificates.cert-manager.io crd/issuers.cert-manager.io --timeout 30s >/dev/null

apply_dry() { # what values...
    local what="$1"
    shift
    render "$@" >"$STATE/chart-$what.yaml" || fail "helm template ($what) failed"
    "${KUBECTL[@]}" apply --server-side --dry-run=server --field-manager helm -f "$STATE/chart-$what.yaml" >"$STATE/chart-$what.applied" 2>&1 ||
        { cat "$STATE/chart-$what.applied" >&2; fail "the real API server refuses the chart with the $what values"; }
    say "the chart with the $what values: $(wc -l <"$STATE/chart-$what.applied") objects accepted (server-side dry run)"
}
apply_dry quick-start
apply_dry single-node --set replicaCount=1 --set podDisruptionBudget.enabled=false
apply_dry cert-manager --set certificates.mode=certManager
apply_dry workload-kinds --set-json "workloadKinds=$(tr -d '\n' <"$ROOT/tests/data/crds/kinds.json")"

# The scenarios' configured workload kinds (tests/e2e/configured_kinds.rs): their CRDs are
# applied by the scenarios, one of them only after confighash started.
render --set "webhook.url=https://127.0.0.1:$WEBHOOK_PORT/mutate" \
    --set "watcher.debounce=$DEBOUNCE" --set "watcher.flapThreshold=$FLAP_THRESHOLD" \
    --set-json "workloadKinds=$(tr -d '\n' <"$ROOT/tests/data/crds/kinds.json")" \
    --set log.format=text >"$STATE/chart-install.yaml"
"${KUBECTL[@]}" apply --server-side --field-manager helm -f "$STATE/chart-install.yaml" >/dev/null ||
    fail "the chart does not apply"
phase "chart applied"

# --- confighash serve, as the chart's ServiceAccount ---
token=$("${KUBECTL[@]}" -n "$NAMESPACE" create token "$RELEASE" --duration 48h) ||
    fail "no token for the ServiceAccount $NAMESPACE/$RELEASE"
cat >"$STATE/confighash.kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
  - name: confighash-test
    cluster:
      server: https://127.0.0.1:$((BASE + 2))
      certificate-authority: $STATE/pki/ca.crt
users:
  - name: confighash
    user:
      token: $token
contexts:
  - name: confighash
    context: {cluster: confighash-test, user: confighash, namespace: $NAMESPACE}
current-context: confighash
EOF
chmod 0600 "$STATE/confighash.kubeconfig"

# The chart's arguments, with the listen addresses and certificate paths of this machine.
mapfile -t serve_args < <("${KUBECTL[@]}" -n "$NAMESPACE" get deployment "$RELEASE" -o json | python3 -c '
import json, sys
args = json.load(sys.stdin)["spec"]["template"]["spec"]["containers"][0]["args"]
ours = ("--listen", "--admin-listen", "--tls-cert", "--tls-key", "--leader-elect")
for a in args:
    if a.split("=", 1)[0] not in ours:
        print(a)
')
[ "${serve_args[0]:-}" = serve ] || fail "the chart's Deployment does not run serve: ${serve_args[*]}"
# serve.sh: starts and stops replicas of confighash serve as this tier runs them, for this script
# and for scenarios that stop, restart or add a replica (CONFIGHASH_E2E_SERVE). Replica N listens
# on 127.0.0.1:BASE+10+2N (webhook; the chart's webhook.url names replica 0's) and BASE+11+2N
# (admin), is named confighash-local-N (its Lease identity), and runs in a session of its own, so
# it outlives the test process that started it.
{
    echo '#!/usr/bin/env bash'
    echo '# Made by scripts/real-tier.sh: serve.sh start|stop|kill N [ARGS...] (ARGS: more serve flags, start only)'
    echo 'set -euo pipefail'
    printf 'STATE=%q\nBASE=%q\nCONFIGHASH=%q\n' "$STATE" "$BASE" "$CONFIGHASH"
    printf 'ARGS=('
    printf '%q ' "${serve_args[@]}"
    printf ')\n'
    cat <<'EOS'
verb="${1:-}"
n="${2:-}"
[[ "$n" =~ ^[0-9]$ ]] || { echo "usage: serve.sh start|stop|kill N (0-9) [ARGS...]" >&2; exit 2; }
shift 2
extra=("$@")
webhook=$((BASE + 10 + 2 * n))
admin=$((BASE + 11 + 2 * n))
pidfile="$STATE/confighash-$n.pid"
log="$STATE/confighash-$n.log"
alive() { [ -f "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null; }
case "$verb" in
start)
    if alive; then echo "serve.sh: replica $n already runs (pid $(cat "$pidfile"))" >&2; exit 1; fi
    mkdir -p "$STATE/confighash-$n"
    KUBECONFIG="$STATE/confighash.kubeconfig" POD_NAME="confighash-local-$n" setsid "$CONFIGHASH" "${ARGS[@]}" \
        --listen "127.0.0.1:$webhook" --admin-listen "127.0.0.1:$admin" \
        --tls-cert "$STATE/confighash-$n/tls.crt" --tls-key "$STATE/confighash-$n/tls.key" \
        --leader-elect true "${extra[@]}" >>"$log" 2>&1 </dev/null &
    echo $! >"$pidfile"
    deadline=$((SECONDS + 60))
    until curl -sf "http://127.0.0.1:$admin/readyz" >/dev/null &&
        curl -sf "http://127.0.0.1:$admin/metrics" | grep -qx 'confighash_watcher_cache_synced 1'; do
        alive || { tail -n 40 "$log" >&2; echo "serve.sh: replica $n exited" >&2; exit 1; }
        [ "$SECONDS" -lt "$deadline" ] || { tail -n 40 "$log" >&2; echo "serve.sh: replica $n not ready and synced after 60 s" >&2; exit 1; }
        sleep 0.1
    done
    ;;
stop | kill)
    alive || { rm -f "$pidfile"; exit 0; }
    pid=$(cat "$pidfile")
    kill "-$([ "$verb" = kill ] && echo KILL || echo TERM)" "$pid"
    deadline=$((SECONDS + 30))
    while kill -0 "$pid" 2>/dev/null; do
        [ "$SECONDS" -lt "$deadline" ] || { kill -KILL "$pid" 2>/dev/null || true; }
        sleep 0.05
    done
    rm -f "$pidfile"
    ;;
*) echo "usage: serve.sh start|stop|kill N" >&2; exit 2 ;;
esac
EOS
} >"$STATE/serve.sh"
chmod +x "$STATE/serve.sh"
"$STATE/serve.sh" start 0 || fail "confighash serve (replica 0) did not start"
say "confighash serve (pid $(cat "$STATE/confighash-0.pid")): ${serve_args[*]:1}"

deadline=$((SECONDS + 60))
until [ "$("${KUBECTL[@]}" get mutatingwebhookconfiguration "$RELEASE" -o jsonpath='{range .webhooks[*]}{.clientConfig.caBundle}{"\n"}{end}' | grep -c .)" = 2 ]; do
    [ "$SECONDS" -lt "$deadline" ] || fail "confighash did not write the caBundle into both webhook entries in 60 s"
    sleep 0.2
done
phase "confighash ready: caBundle written into both webhook entries, caches synced"

# --- the scenarios ---
export CONFIGHASH_E2E_KUBECONFIG="$STATE/admin.kubeconfig"
export CONFIGHASH_E2E_AUDIT_LOG="$STATE/audit.log"
export CONFIGHASH_E2E_USER="system:serviceaccount:$NAMESPACE:$RELEASE"
# Replica 0's and replica 1's admin ports (serve.sh).
export CONFIGHASH_E2E_METRICS_URL="http://127.0.0.1:$ADMIN_PORT/metrics,http://127.0.0.1:$((ADMIN_PORT + 2))/metrics"
export CONFIGHASH_E2E_DEBOUNCE="$DEBOUNCE"
export CONFIGHASH_E2E_SERVE="$STATE/serve.sh"
export CONFIGHASH_E2E_STORIES="$STATE/stories.jsonl"
rm -f "$CONFIGHASH_E2E_STORIES"
# The same settings for a shell (tests or benches against this control plane, with
# CONFIGHASH_REAL_KEEP=1): `source $STATE/e2e.env`.
for var in $(compgen -e | grep '^CONFIGHASH_E2E_'); do
    printf 'export %s=%q\n' "$var" "${!var}"
done >"$STATE/e2e.env"
status=0
# Scenarios that stop, restart or add confighash replicas take a lock beside serve.sh that keeps
# every other scenario out while they run (crates/testkit/src/e2e/support.rs, Env::controlling).
cargo test --locked --test e2e -- "${test_args[@]}" || status=$?
phase "e2e scenarios and user stories on the real control plane: exit $status"
if [ -s "$CONFIGHASH_E2E_STORIES" ]; then
    python3 "$HERE/stories-table.py" "$CONFIGHASH_E2E_STORIES" >"$STATE/user-stories.md"
    say "the user stories' table: $STATE/user-stories.md"
fi
"$STATE/serve.sh" start 0 2>/dev/null || true
for log in "$STATE"/confighash-*.log; do
    grep -E ' (ERROR|WARN) ' "$log" >>"$STATE/confighash.warnings" || true
done
if [ -s "$STATE/confighash.warnings" ]; then
    say "confighash logged $(wc -l <"$STATE/confighash.warnings") warnings or errors (in $STATE/confighash.warnings)"
fi
say "real tier: $((SECONDS - began)) s in all"
exit "$status"
