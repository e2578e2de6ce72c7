#!/usr/bin/env bash
# A Kubernetes control plane on loopback, for the real tier of the tests.
#
#   scripts/control-plane.sh up     # start etcd, kube-apiserver, kube-controller-manager,
#                                   # kube-scheduler and kwok with two fake nodes
#   scripts/control-plane.sh env    # print `export KUBECONFIG=...` and the rest for a shell
#   scripts/control-plane.sh down   # stop every process `up` started, by pid
#   scripts/control-plane.sh restart kube-apiserver ...   # stop and start components again
#   scripts/control-plane.sh compact   # compact etcd's history up to its current revision
#
# The binaries come from scripts/install-control-plane.sh (built from Go modules, cached). Every
# listener is on 127.0.0.1, the Service ClusterIP range is 127.96.0.0/16 and kwok's pod CIDR
# 127.128.0.0/16, so an address that slips through (a Service, a webhook) is loopback too.
#
# kube-apiserver runs with RBAC (and Node) authorization, its default admission plugins
# (MutatingAdmissionWebhook among them), ServiceAccount token signing, an admin client
# certificate (system:masters) and an audit log of every request made by a ServiceAccount
# ($STATE/audit.log, JSON lines). kube-controller-manager runs every default controller, each with
# its own ServiceAccount's credentials. kwok marks the fake nodes Ready and the pods scheduled on
# them Running and Ready, so a Deployment's rollout completes; no container runs.
#
# Where: CONFIGHASH_CONTROL_PLANE_DIR (default target/control-plane in the repository). Ports:
# CONFIGHASH_CP_PORT_BASE (default 24700): etcd base+0 (client) and base+1 (peer), kube-apiserver
# base+2, kube-controller-manager base+3, kube-scheduler base+4.
#
# The real-node tier (scripts/node.sh) runs the same control plane inside its own network
# namespace, with CONFIGHASH_CP_ADDRESS (kube-apiserver's address, default 127.0.0.1; elsewhere
# it also publishes itself as the kubernetes Service's endpoint), CONFIGHASH_CP_SERVICE_RANGE
# (default 127.96.0.0/16) and CONFIGHASH_CP_KWOK=0 (no kwok and no fake nodes: real kubelets
# register their nodes).
set -euo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$HERE/.." && pwd)"
STATE="${CONFIGHASH_CONTROL_PLANE_DIR:-$ROOT/target/control-plane}"
BASE="${CONFIGHASH_CP_PORT_BASE:-24700}"
ETCD_PORT=$BASE
ETCD_PEER_PORT=$((BASE + 1))
API_PORT=$((BASE + 2))
KCM_PORT=$((BASE + 3))
SCHED_PORT=$((BASE + 4))
ADDRESS="${CONFIGHASH_CP_ADDRESS:-127.0.0.1}"
SERVICE_RANGE="${CONFIGHASH_CP_SERVICE_RANGE:-127.96.0.0/16}"
POD_CIDR=127.128.0.0/16
NODES=(kwok-node-0 kwok-node-1)
# Start order; `down` stops them in reverse.
COMPONENTS=(etcd kube-apiserver kube-controller-manager kube-scheduler kwok)
KWOK="${CONFIGHASH_CP_KWOK:-1}"
if [ "$KWOK" = 0 ]; then
    COMPONENTS=(etcd kube-apiserver kube-controller-manager kube-scheduler)
fi
# The kubernetes Service's ClusterIP: the first address of the range.
KUBERNETES_SERVICE_IP=$(python3 -c 'import ipaddress,sys; print(ipaddress.ip_network(sys.argv[1])[1])' "$SERVICE_RANGE")

say() { echo "control-plane.sh: $*" >&2; }
fail() {
    say "$*"
    exit 1
}

usage() {
    echo "usage: scripts/control-plane.sh up|down|env|compact|restart COMPONENT..." >&2
    exit 2
}

pid_of() { cat "$STATE/$1.pid" 2>/dev/null || true; }
alive() {
    local pid
    pid=$(pid_of "$1")
    [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null
}
running() {
    local c
    for c in "${COMPONENTS[@]}"; do
        alive "$c" && return 0
    done
    return 1
}

port_in_use() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# Polls `check` (a command) every 0.2 s until it succeeds or `seconds` pass.
wait_for() {
    local what="$1" seconds="$2" component="$3"
    shift 3
    local deadline=$((SECONDS + seconds))
    until "$@" >/dev/null 2>&1; do
        if [ -n "$component" ] && ! alive "$component"; then
            tail -n 30 "$STATE/$component.log" >&2 || true
            fail "$component exited while waiting for $what (log: $STATE/$component.log)"
        fi
        [ "$SECONDS" -lt "$deadline" ] || fail "timed out after ${seconds} s waiting for $what"
        sleep 0.2
    done
}

# Starts a component in the background, keeping its command line for `restart`.
start() {
    local name="$1"
    shift
    printf '%q ' "$@" >"$STATE/$name.command"
    "$@" >>"$STATE/$name.log" 2>&1 &
    echo $! >"$STATE/$name.pid"
}

certs() {
    local dir="$STATE/pki"
    mkdir -p "$dir"
    cd "$dir"
    openssl req -x509 -newkey rsa:2048 -nodes -keyout ca.key -out ca.crt -days 30 \
        -subj "/CN=confighash-test-ca" -addext "basicConstraints=critical,CA:TRUE" \
        -addext "keyUsage=critical,keyCertSign,cRLSign,digitalSignature" 2>/dev/null
    # The API server's serving certificate: loopback and the kubernetes Service's names.
    openssl req -newkey rsa:2048 -nodes -keyout apiserver.key -out apiserver.csr \
        -subj "/CN=kube-apiserver" 2>/dev/null
    openssl x509 -req -in apiserver.csr -CA ca.crt -CAkey ca.key -CAcreateserial -days 30 \
        -out apiserver.crt -extfile <(printf '%s\n' \
            "subjectAltName=IP:127.0.0.1,IP:$ADDRESS,IP:$KUBERNETES_SERVICE_IP,DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local" \
            "extendedKeyUsage=serverAuth" "keyUsage=critical,digitalSignature,keyEncipherment") 2>/dev/null
    # Client certificates: the admin, the controllers' own identities, and the API server's to
    # the kubelets (logs, exec).
    local who
    for who in "admin:/O=system:masters/CN=admin" \
        "apiserver-kubelet-client:/O=system:masters/CN=kube-apiserver-kubelet-client" \
        "kube-controller-manager:/CN=system:kube-controller-manager" \
        "kube-scheduler:/CN=system:kube-scheduler" \
        "kwok:/O=system:masters/CN=kwok"; do
        local name="${who%%:*}" subject="${who#*:}"
        openssl req -newkey rsa:2048 -nodes -keyout "$name.key" -out "$name.csr" \
            -subj "$subject" 2>/dev/null
        openssl x509 -req -in "$name.csr" -CA ca.crt -CAkey ca.key -CAcreateserial -days 30 \
            -out "$name.crt" -extfile <(echo "extendedKeyUsage=clientAuth") 2>/dev/null
    done
    # ServiceAccount tokens are signed with this key.
    openssl genrsa -out sa.key 2048 2>/dev/null
    openssl rsa -in sa.key -pubout -out sa.pub 2>/dev/null
    rm -f ./*.csr ca.srl
    cd - >/dev/null
}

kubeconfig() {
    local name="$1"
    cat >"$STATE/$name.kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
  - name: confighash-test
    cluster:
      server: https://$ADDRESS:$API_PORT
      certificate-authority: $STATE/pki/ca.crt
users:
  - name: $name
    user:
      client-certificate: $STATE/pki/$name.crt
      client-key: $STATE/pki/$name.key
contexts:
  - name: $name
    context: {cluster: confighash-test, user: $name}
current-context: $name
EOF
}

# The audit log is never rotated: the tests read it by offset, and a count from a rotated log
# would miss every request written to the file rotated away. (0, which reads as "no limit", is
# kube-apiserver's rotation default of 100 MB: a mass sync or a wave of 2,000 workloads crosses
# it.) One TiB, in MB.
AUDIT_LOG_MAX_MB=1048576

audit_policy() {
    # Every request a ServiceAccount makes: writes with their request bodies, except to Secrets
    # (their content stays out of the log), everything else as metadata.
    cat >"$STATE/audit-policy.yaml" <<'EOF'
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
  - level: Metadata
    userGroups: ["system:serviceaccounts"]
    resources: [{group: "", resources: [secrets]}]
  # The workload a write stored: the fault run reads each touch's stored stamp from it.
  - level: RequestResponse
    userGroups: ["system:serviceaccounts"]
    verbs: [patch, update]
    resources:
      - {group: apps, resources: [deployments, statefulsets, daemonsets]}
      - {group: batch, resources: [cronjobs]}
      - {group: argoproj.io, resources: [rollouts]}
  - level: Request
    userGroups: ["system:serviceaccounts"]
    verbs: [create, update, patch, delete, deletecollection]
  - level: Metadata
    userGroups: ["system:serviceaccounts"]
  - level: None
EOF
}

nodes() {
    local node
    for node in "${NODES[@]}"; do
        cat <<EOF
---
apiVersion: v1
kind: Node
metadata:
  name: $node
  annotations:
    kwok.x-k8s.io/node: fake
    node.alpha.kubernetes.io/ttl: "0"
  labels:
    kubernetes.io/hostname: $node
    kubernetes.io/os: linux
    kubernetes.io/arch: amd64
    type: kwok
status:
  allocatable: {cpu: "32", memory: 256Gi, pods: "250"}
  capacity: {cpu: "32", memory: 256Gi, pods: "250"}
EOF
    done
}

up() {
    if running; then
        local c pids=()
        for c in "${COMPONENTS[@]}"; do alive "$c" && pids+=("$c=$(pid_of "$c")"); done
        fail "a control plane is already running from $STATE (${pids[*]}); run 'scripts/control-plane.sh down' first"
    fi
    local began=$SECONDS
    BIN=$("$HERE/install-control-plane.sh") || fail "scripts/install-control-plane.sh failed"
    local p
    for p in etcd kube-apiserver kube-controller-manager kube-scheduler kubectl kwok; do
        [ -x "$BIN/$p" ] || fail "$BIN/$p is missing: run scripts/install-control-plane.sh"
    done
    for p in "$ETCD_PORT" "$ETCD_PEER_PORT" "$API_PORT" "$KCM_PORT" "$SCHED_PORT"; do
        port_in_use "$p" && fail "port $p is in use on 127.0.0.1 (set CONFIGHASH_CP_PORT_BASE to use other ports)"
    done
    command -v openssl >/dev/null || fail "openssl is needed to make the control plane's certificates"

    rm -rf "$STATE"
    mkdir -p "$STATE"
    echo "$BIN" >"$STATE/bin"
    certs
    kubeconfig admin
    kubeconfig kube-controller-manager
    kubeconfig kube-scheduler
    kubeconfig kwok
    audit_policy

    start etcd "$BIN/etcd" --name confighash-test --data-dir "$STATE/etcd" \
        --listen-client-urls "http://127.0.0.1:$ETCD_PORT" \
        --advertise-client-urls "http://127.0.0.1:$ETCD_PORT" \
        --listen-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
        --initial-advertise-peer-urls "http://127.0.0.1:$ETCD_PEER_PORT" \
        --initial-cluster "confighash-test=http://127.0.0.1:$ETCD_PEER_PORT" \
        --unsafe-no-fsync --quota-backend-bytes 8589934592
    wait_for "etcd" 30 etcd curl -sf "http://127.0.0.1:$ETCD_PORT/health"

    local pki="$STATE/pki"
    # On loopback nothing can reach an endpoint of the kubernetes Service; elsewhere (the node
    # tier) the API server publishes its address there, as in any cluster.
    local reconciler=lease
    [ "$ADDRESS" != 127.0.0.1 ] || reconciler=none
    start kube-apiserver "$BIN/kube-apiserver" \
        --etcd-servers "http://127.0.0.1:$ETCD_PORT" \
        --bind-address "$ADDRESS" --advertise-address "$ADDRESS" --secure-port "$API_PORT" \
        --service-cluster-ip-range "$SERVICE_RANGE" \
        --tls-cert-file "$pki/apiserver.crt" --tls-private-key-file "$pki/apiserver.key" \
        --client-ca-file "$pki/ca.crt" \
        --authorization-mode Node,RBAC \
        --service-account-issuer "https://127.0.0.1:$API_PORT" \
        --service-account-key-file "$pki/sa.pub" \
        --service-account-signing-key-file "$pki/sa.key" \
        --audit-policy-file "$STATE/audit-policy.yaml" \
        --audit-log-path "$STATE/audit.log" --audit-log-format json \
        --audit-log-maxsize "$AUDIT_LOG_MAX_MB" \
        --endpoint-reconciler-type "$reconciler" \
        --kubelet-client-certificate "$pki/apiserver-kubelet-client.crt" \
        --kubelet-client-key "$pki/apiserver-kubelet-client.key" \
        --kubelet-preferred-address-types InternalIP \
        --allow-privileged --profiling=false
    wait_for "kube-apiserver /readyz" 60 kube-apiserver \
        "$BIN/kubectl" --kubeconfig "$STATE/admin.kubeconfig" get --raw /readyz

    start kube-controller-manager "$BIN/kube-controller-manager" \
        --kubeconfig "$STATE/kube-controller-manager.kubeconfig" \
        --authentication-kubeconfig "$STATE/kube-controller-manager.kubeconfig" \
        --authorization-kubeconfig "$STATE/kube-controller-manager.kubeconfig" \
        --bind-address 127.0.0.1 --secure-port "$KCM_PORT" \
        --use-service-account-credentials \
        --service-account-private-key-file "$pki/sa.key" --root-ca-file "$pki/ca.crt" \
        --cluster-signing-cert-file "$pki/ca.crt" --cluster-signing-key-file "$pki/ca.key" \
        --service-cluster-ip-range "$SERVICE_RANGE" \
        --leader-elect=false --kube-api-qps 200 --kube-api-burst 400 \
        --concurrent-deployment-syncs 10 --profiling=false
    start kube-scheduler "$BIN/kube-scheduler" \
        --kubeconfig "$STATE/kube-scheduler.kubeconfig" \
        --authentication-kubeconfig "$STATE/kube-scheduler.kubeconfig" \
        --authorization-kubeconfig "$STATE/kube-scheduler.kubeconfig" \
        --bind-address 127.0.0.1 --secure-port "$SCHED_PORT" \
        --leader-elect=false --kube-api-qps 200 --kube-api-burst 400 --profiling=false
    local kubectl=("$BIN/kubectl" --kubeconfig "$STATE/admin.kubeconfig")
    if [ "$KWOK" != 0 ]; then
        local stages
        stages=$(find "$BIN/kwok-stages" -name '*.yaml' | sort | paste -sd, -)
        # Only the fake nodes: a real kubelet's node is never kwok's.
        start kwok "$BIN/kwok" --kubeconfig "$STATE/kwok.kubeconfig" --config "$stages" \
            --manage-nodes-with-annotation-selector kwok.x-k8s.io/node=fake --cidr "$POD_CIDR" --node-ip 127.0.0.2
        nodes | "${kubectl[@]}" apply -f - >/dev/null || fail "could not create the fake nodes"
        wait_for "the fake nodes to be Ready" 60 kwok \
            "${kubectl[@]}" wait --for=condition=Ready node --all --timeout=1s
    fi
    # The ServiceAccount controller has run once the default namespace has its ServiceAccount.
    wait_for "kube-controller-manager (the default ServiceAccount)" 60 kube-controller-manager \
        "${kubectl[@]}" -n default get serviceaccount default
    for p in kube-scheduler; do
        alive "$p" || fail "$p exited (log: $STATE/$p.log)"
    done
    say "up in $((SECONDS - began)) s: kube-apiserver at https://$ADDRESS:$API_PORT; KUBECONFIG=$STATE/admin.kubeconfig"
}

down() {
    local i c pid stopped=0
    for ((i = ${#COMPONENTS[@]} - 1; i >= 0; i--)); do
        c=${COMPONENTS[$i]}
        pid=$(pid_of "$c")
        [ -n "$pid" ] || continue
        if kill -0 "$pid" 2>/dev/null; then
            kill "$pid" 2>/dev/null || true
            local deadline=$((SECONDS + 15))
            while kill -0 "$pid" 2>/dev/null && [ "$SECONDS" -lt "$deadline" ]; do sleep 0.1; done
            kill -0 "$pid" 2>/dev/null && kill -9 "$pid" 2>/dev/null || true
            stopped=$((stopped + 1))
        fi
        rm -f "$STATE/$c.pid"
    done
    say "stopped $stopped processes (logs kept in $STATE)"
}

# Restarts components of a running control plane, in the order given: each is stopped (SIGTERM,
# then SIGKILL after 5 s: kube-apiserver's graceful shutdown waits up to a minute for its
# watches, and a crash is a restart too) and started again with its command line, and
# kube-apiserver is waited for until ready. Every watch on kube-apiserver ends; a client that
# resumes from before the writes made meanwhile gets 410 Gone from the new watch cache.
restart() {
    [ $# -gt 0 ] || usage
    local began=$SECONDS c pid command
    BIN=$(cat "$STATE/bin")
    for c in "$@"; do
        [[ " ${COMPONENTS[*]} " == *" $c "* ]] || fail "no component $c (${COMPONENTS[*]})"
        alive "$c" || fail "$c is not running (scripts/control-plane.sh up)"
        [ -f "$STATE/$c.command" ] || fail "no $STATE/$c.command: run 'scripts/control-plane.sh up' again"
        pid=$(pid_of "$c")
        kill "$pid"
        local deadline=$((SECONDS + 5))
        while kill -0 "$pid" 2>/dev/null; do
            [ "$SECONDS" -lt "$deadline" ] || kill -9 "$pid" 2>/dev/null || true
            sleep 0.1
        done
        command=$(cat "$STATE/$c.command")
        eval "start $c $command"
        if [ "$c" = kube-apiserver ]; then
            wait_for "kube-apiserver /readyz" 60 kube-apiserver \
                "$BIN/kubectl" --kubeconfig "$STATE/admin.kubeconfig" get --raw /readyz
        fi
    done
    say "restarted $* in $((SECONDS - began)) s"
}

# Compacts etcd up to its current revision, through its JSON gateway, as kube-apiserver does
# every five minutes: every watch that resumes from an older resourceVersion, in etcd or in a
# watch cache that starts again (a restart of kube-apiserver), then gets 410 Gone.
compact() {
    local command url revision
    command=$(cat "$STATE/etcd.command" 2>/dev/null) || fail "no $STATE/etcd.command: run 'scripts/control-plane.sh up' again"
    url=$(sed -n 's/.*--advertise-client-urls \([^ ]*\).*/\1/p' <<<"$command")
    [ -n "$url" ] || fail "no --advertise-client-urls in $STATE/etcd.command"
    revision=$(curl -sf -X POST "$url/v3/kv/range" -d '{"key":"AA=="}' |
        python3 -c 'import json,sys; print(json.load(sys.stdin)["header"]["revision"])') ||
        fail "could not read etcd's revision at $url"
    curl -sf -X POST "$url/v3/kv/compaction" -d "{\"revision\":\"$revision\",\"physical\":true}" >/dev/null ||
        fail "etcd at $url did not compact to revision $revision"
    say "compacted etcd to revision $revision"
}

env_() {
    [ -f "$STATE/admin.kubeconfig" ] || fail "no control plane in $STATE: run 'scripts/control-plane.sh up'"
    running || say "warning: the control plane in $STATE is not running"
    echo "export KUBECONFIG=$STATE/admin.kubeconfig"
    echo "export CONFIGHASH_CONTROL_PLANE_DIR=$STATE"
    echo "export CONFIGHASH_E2E_AUDIT_LOG=$STATE/audit.log"
    echo "export PATH=$(cat "$STATE/bin"):\$PATH"
}

case "${1:-}" in
up) up ;;
down) down ;;
env) env_ ;;
compact) compact ;;
restart)
    shift
    restart "$@"
    ;;
*) usage ;;
esac
