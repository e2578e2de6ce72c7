#!/usr/bin/env bash
# The real-node tier: confighash as users run it. The image built here, the chart installed as
# the README's quick start says (only the image's repository, tag and pull policy set), on a
# control plane with real nodes (scripts/node.sh), and the users' stories read inside the
# containers (tests/node/tier.py).
#
#   scripts/node-tier.sh                 # build, start, check, stop
#   NODE_ONLY=quick_start_install,examples_stamped_at_create scripts/node-tier.sh   # some checks
#   CONFIGHASH_NODE_KEEP=1 scripts/node-tier.sh    # leave the cluster running at the end
#   scripts/node-tier.sh tests/node/gitops.py       # other checks on the same cluster
#                                                    # (scripts/gitops-tier.sh)
#
# Fails (never skips) when something it needs cannot be had.
set -euo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$HERE/.." && pwd)"
export CONFIGHASH_NODE_DIR="${CONFIGHASH_NODE_DIR:-$ROOT/target/node}"
STATE="$CONFIGHASH_NODE_DIR"
CHECKS="$ROOT/${1:-tests/node/tier.py}"
REPOSITORY=ghcr.io/confighash/confighash
TAG=0.1.0-tier
NEXT_TAG=0.1.0-tier-next

say() { echo "node-tier.sh: $*" >&2; }
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
[ -f "$CHECKS" ] || fail "no checks at $CHECKS"
[ "$(id -u)" = 0 ] || fail "the node tier needs root (network namespaces, mounts, cgroups)"
for tool in go cargo gcc python3 openssl curl ip nsenter flock; do
    command -v "$tool" >/dev/null || fail "$tool is needed for the node tier and is not on PATH"
done

BIN=$("$HERE/install-control-plane.sh") || fail "scripts/install-control-plane.sh failed"
NODE_BIN=$("$HERE/install-node.sh") || fail "scripts/install-node.sh failed"
HELM=$("$HERE/install-helm.sh") || fail "scripts/install-helm.sh failed"
phase "tools ready"

(cd "$ROOT" && cargo build --release --locked --bin confighash) || fail "cargo build --release failed"
image=$("$HERE/build-image.sh" --repository "$REPOSITORY" --tag "$TAG") || fail "scripts/build-image.sh failed"
next=$("$HERE/build-image.sh" --repository "$REPOSITORY" --tag "$NEXT_TAG") || fail "scripts/build-image.sh failed"
phase "image built: $(du -h "$image" | cut -f1) ($image)"

cleanup() {
    local rc=$?
    if [ "${CONFIGHASH_NODE_KEEP:-}" = 1 ]; then
        say "left running (CONFIGHASH_NODE_KEEP=1): eval \"\$(scripts/node.sh env)\"; scripts/node.sh run kubectl get pods -A; scripts/node.sh down"
        exit "$rc"
    fi
    # `down` fails when it leaves a process, a mount, a cgroup or the namespace behind.
    "$HERE/node.sh" down || rc=1
    exit "$rc"
}
"$HERE/node.sh" down >/dev/null 2>&1 || true
trap cleanup EXIT
"$HERE/node.sh" up
nodes=$(cat "$STATE/nodes")
for ((n = 0; n < nodes; n++)); do
    for archive in "$image" "$next"; do
        "$NODE_BIN/ctr" --address "$STATE/node-$n/containerd.sock" -n k8s.io images import --no-unpack "$archive" >/dev/null ||
            fail "ctr images import $archive into node-$n failed"
    done
done
phase "cluster up, images imported into $nodes nodes"

status=0
NODE_KUBECTL="$BIN/kubectl" NODE_HELM="$HELM" NODE_CHART="$ROOT/charts/confighash" NODE_DEPLOY="$ROOT/deploy" \
    NODE_AUDIT_LOG="$STATE/control-plane/audit.log" NODE_IMAGE_REPOSITORY="$REPOSITORY" NODE_IMAGE_TAG="$TAG" \
    NODE_IMAGE_NEXT_TAG="$NEXT_TAG" NODE_APP_IMAGE="$(cat "$NODE_BIN/images/app.name")" NODE_EXAMPLES="$ROOT/examples" \
    NODE_SH="$HERE/node.sh" NODE_CONFIGHASH="$ROOT/target/release/confighash" NODE_COUNT="$nodes" NODE_STATE="$STATE" KUBECONFIG="$STATE/control-plane/admin.kubeconfig" \
    HELM_CACHE_HOME="$STATE/helm/cache" HELM_CONFIG_HOME="$STATE/helm/config" HELM_DATA_HOME="$STATE/helm/data" \
    "$HERE/node.sh" run python3 "$CHECKS" || status=$?
phase "the checks: exit $status"
say "node tier: $((SECONDS - began)) s in all"
exit "$status"
