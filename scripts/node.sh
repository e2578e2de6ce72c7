#!/usr/bin/env bash
# A Kubernetes cluster with real nodes, for the real-node tier of the tests.
#
#   scripts/node.sh up      # a network namespace; inside it the control plane and real nodes
#                           # (containerd, runc, kubelet) and kube-proxy; the images imported
#   scripts/node.sh env     # print `export KUBECONFIG=...` and the rest for a shell
#   scripts/node.sh run CMD...   # run a command inside the namespace (kubectl, tests)
#   scripts/node.sh down    # stop every process, unmount, remove cgroups and the namespace
#   scripts/node.sh restart-node N   # kill -9 node N's kubelet and containerd, start them again
#
# Everything lives in the network namespace $NETNS, made here, with no link out of it: the node
# addresses 198.18.0.2, 198.18.0.3 (on a bridge without ports), the pods 198.19.0.0/24 (a CNI
# bridge per node, no masquerade), the Services 198.18.128.0/20 (kube-proxy, iptables mode, one
# for the namespace). kube-apiserver listens on node 0's address; etcd and the controllers on the
# namespace's own loopback. So whatever a pod or a Service dials stays inside. Enter it with
# `scripts/node.sh run` (nsenter --net; `ip netns exec` remounts /sys, and runc then finds no
# cgroup mount).
#
# The binaries come from scripts/install-control-plane.sh and scripts/install-node.sh (built from
# Go modules, cached). Environment: CONFIGHASH_NODE_DIR (default target/node), CONFIGHASH_NODES
# (1 or 2, default 2), CONFIGHASH_NODE_NETNS (default confighash-node).
set -euo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
ROOT="$(cd "$HERE/.." && pwd)"
STATE="${CONFIGHASH_NODE_DIR:-$ROOT/target/node}"
NETNS="${CONFIGHASH_NODE_NETNS:-confighash-node}"
NODE_COUNT="${CONFIGHASH_NODES:-2}"
CP="$STATE/control-plane"
SERVICE_RANGE=198.18.128.0/20
CLUSTER_CIDR=198.19.0.0/24
API_PORT=24702 # control-plane.sh: its port base (24700) + 2
# Node N: address 198.18.0.(2+N), pods 198.19.0.(128*N)/25, kubelet on its own address.
node_ip() { echo "198.18.0.$((2 + $1))"; }
node_pods() { echo "198.19.0.$((128 * $1))/25"; }
node_name() { echo "node-$1"; }

say() { echo "node.sh: $*" >&2; }
fail() {
    say "$*"
    exit 1
}
usage() {
    echo "usage: scripts/node.sh up|down|env|run CMD...|restart-node N" >&2
    exit 2
}
[[ "$NODE_COUNT" =~ ^[12]$ ]] || fail "CONFIGHASH_NODES must be 1 or 2, not $NODE_COUNT"
[[ "$NETNS" =~ ^[a-z0-9-]{1,32}$ ]] || fail "CONFIGHASH_NODE_NETNS must be a short name of a-z, 0-9 and -"

in_ns() { nsenter --net="/var/run/netns/$NETNS" -- "$@"; }
pid_alive() { [ -n "$1" ] && kill -0 "$1" 2>/dev/null; }
pid_of() { cat "$STATE/$1.pid" 2>/dev/null || true; }

# Polls a command every 0.2 s until it succeeds, `seconds` pass, or process `component` exits.
wait_for() {
    local what="$1" seconds="$2" component="$3"
    shift 3
    local deadline=$((SECONDS + seconds))
    until "$@" >/dev/null 2>&1; do
        if [ -n "$component" ] && ! pid_alive "$(pid_of "$component")"; then
            tail -n 30 "$STATE/$component.log" >&2 || true
            fail "$component exited while waiting for $what (log: $STATE/$component.log)"
        fi
        [ "$SECONDS" -lt "$deadline" ] || {
            [ -z "$component" ] || tail -n 30 "$STATE/$component.log" >&2 || true
            fail "timed out after ${seconds} s waiting for $what"
        }
        sleep 0.2
    done
}

# Starts a process inside the namespace, in the background, its pid in $STATE/NAME.pid.
start() {
    local name="$1"
    shift
    printf '%q ' "$@" >"$STATE/$name.command"
    in_ns "$@" >>"$STATE/$name.log" 2>&1 &
    echo $! >"$STATE/$name.pid"
}

# Ends a process by pid: SIGTERM, then SIGKILL after `grace` seconds.
stop_pid() {
    local pid="$1" grace="${2:-10}"
    pid_alive "$pid" || return 0
    kill "$pid" 2>/dev/null || true
    local deadline=$((SECONDS + grace))
    while pid_alive "$pid" && [ "$SECONDS" -lt "$deadline" ]; do sleep 0.1; done
    pid_alive "$pid" && kill -9 "$pid" 2>/dev/null || true
    while pid_alive "$pid"; do sleep 0.05; done
}

client_cert() { # name subject
    local pki="$CP/pki"
    openssl req -newkey rsa:2048 -nodes -keyout "$pki/$1.key" -out "$pki/$1.csr" -subj "$2" 2>/dev/null
    openssl x509 -req -in "$pki/$1.csr" -CA "$pki/ca.crt" -CAkey "$pki/ca.key" -CAcreateserial -days 30 \
        -out "$pki/$1.crt" -extfile <(echo "extendedKeyUsage=clientAuth") 2>/dev/null
    rm -f "$pki/$1.csr" "$pki/ca.srl"
    cat >"$STATE/$1.kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
  - name: confighash-node
    cluster: {server: "https://$(node_ip 0):$API_PORT", certificate-authority: "$pki/ca.crt"}
users:
  - name: $1
    user: {client-certificate: "$pki/$1.crt", client-key: "$pki/$1.key"}
contexts:
  - name: $1
    context: {cluster: confighash-node, user: $1}
current-context: $1
EOF
}

network() {
    ip netns add "$NETNS" || fail "ip netns add $NETNS failed (root is needed)"
    in_ns ip link set lo up
    # The nodes' addresses on a bridge without ports (this kernel has no dummy driver); the
    # Service range is routed there so that a ClusterIP has a route before kube-proxy's DNAT.
    in_ns ip link add br-nodes type bridge
    local n
    for ((n = 0; n < NODE_COUNT; n++)); do
        in_ns ip addr add "$(node_ip "$n")/24" dev br-nodes
    done
    in_ns ip link set br-nodes up
    in_ns ip route add "$SERVICE_RANGE" dev br-nodes
    in_ns sysctl -qw net.ipv4.ip_forward=1
}

containerd_config() { # n
    local dir="$STATE/node-$1" bin="$NODE_BIN"
    mkdir -p "$dir/cni-conf" "$dir/cni-ipam"
    cat >"$dir/cni-conf/10-bridge.conflist" <<EOF
{
  "cniVersion": "1.0.0",
  "name": "confighash-pods-$1",
  "plugins": [
    {
      "type": "bridge", "bridge": "cni$1", "isGateway": true, "ipMasq": false, "hairpinMode": true,
      "ipam": {
        "type": "host-local", "dataDir": "$dir/cni-ipam",
        "ranges": [[{"subnet": "$(node_pods "$1")"}]], "routes": [{"dst": "0.0.0.0/0"}]
      }
    }
  ]
}
EOF
    cat >"$dir/containerd.toml" <<EOF
version = 3
root = "$dir/containerd/root"
state = "$dir/containerd/state"
[grpc]
  address = "$dir/containerd.sock"
[ttrpc]
  address = "$dir/containerd.sock.ttrpc"
[plugins.'io.containerd.cri.v1.images']
  snapshotter = "native"
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = "$(cat "$bin/images/pause.name")"
[plugins.'io.containerd.cri.v1.runtime']
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  disable_apparmor = true
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = ["/usr/lib/cni"]
    conf_dir = "$dir/cni-conf"
  [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
    BinaryName = "$(command -v runc)"
    Root = "$dir/runc"
[plugins.'io.containerd.snapshotter.v1.native']
  root_path = "$dir/containerd/native"
EOF
}

kubelet_config() { # n
    local dir="$STATE/node-$1"
    client_cert "kubelet-$1" "/O=system:nodes/CN=system:node:$(node_name "$1")"
    cat >"$dir/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: $(node_ip "$1")
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: $((10248 + 10 * $1))
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: "$CP/pki/ca.crt"}
authorization: {mode: Webhook}
containerRuntimeEndpoint: "unix://$dir/containerd.sock"
# This machine: cgroup v1 (hybrid), no CAP_SYS_RESOURCE.
cgroupDriver: cgroupfs
cgroupRoot: /confighash-node-$1
failCgroupV1: false
oomScoreAdj: 0
failSwapOn: false
clusterDomain: cluster.local
resolvConf: ""
podLogsDir: "$dir/pod-logs"
# The images were imported, never pulled: nothing may collect them, and no disk threshold evicts.
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {memory.available: "0%", nodefs.available: "0%", nodefs.inodesFree: "0%", imagefs.available: "0%"}
localStorageCapacityIsolation: false
serializeImagePulls: false
maxPods: 110
# Fast status for the tests: a new pod's readiness and a node's heartbeat.
nodeStatusUpdateFrequency: 4s
syncFrequency: 10s
shutdownGracePeriod: 0s
EOF
}

# The node's cgroup root in every hierarchy of this machine's cgroup v1 (the kubelet's
# cgroupRoot must exist); a new cpuset gets its parent's CPUs and memory nodes.
node_cgroups() { # n
    local h cg
    for h in /sys/fs/cgroup/*/; do
        [ -f "$h/cgroup.procs" ] || continue
        cg="$h/confighash-node-$1"
        mkdir -p "$cg" || fail "cannot make the cgroup $cg"
        if [ -f "$h/cpuset.cpus" ] && [ -z "$(cat "$cg/cpuset.cpus")" ]; then
            cat "$h/cpuset.cpus" >"$cg/cpuset.cpus"
            cat "$h/cpuset.mems" >"$cg/cpuset.mems"
        fi
    done
}

start_node() { # n
    local n="$1" dir="$STATE/node-$1"
    node_cgroups "$n"
    start "containerd-$n" "$NODE_BIN/containerd" --config "$dir/containerd.toml"
    wait_for "containerd $n" 30 "containerd-$n" test -S "$dir/containerd.sock"
    wait_for "containerd $n's CRI" 30 "containerd-$n" "$NODE_BIN/ctr" --address "$dir/containerd.sock" -n k8s.io version
    start "kubelet-$n" "$NODE_BIN/kubelet" --config "$dir/kubelet.yaml" \
        --kubeconfig "$STATE/kubelet-$n.kubeconfig" --root-dir "$dir/kubelet" --cert-dir "$dir/kubelet-pki" \
        --hostname-override "$(node_name "$n")" --node-ip "$(node_ip "$n")" --v 1
}

up() {
    if ip netns list 2>/dev/null | grep -qw "^$NETNS"; then
        fail "the namespace $NETNS exists: run 'scripts/node.sh down' first"
    fi
    local began=$SECONDS
    BIN=$("$HERE/install-control-plane.sh") || fail "scripts/install-control-plane.sh failed"
    NODE_BIN=$("$HERE/install-node.sh") || fail "scripts/install-node.sh failed"
    for tool in ip nsenter openssl python3 iptables curl; do
        command -v "$tool" >/dev/null || fail "$tool is needed for the node tier"
    done
    rm -rf "$STATE"
    mkdir -p "$STATE"
    echo "$BIN" >"$STATE/bin"
    echo "$NODE_BIN" >"$STATE/node-bin"
    echo "$NODE_COUNT" >"$STATE/nodes"
    network

    CONFIGHASH_CONTROL_PLANE_DIR="$CP" CONFIGHASH_CP_ADDRESS="$(node_ip 0)" CONFIGHASH_CP_PORT_BASE=24700 \
        CONFIGHASH_CP_SERVICE_RANGE="$SERVICE_RANGE" CONFIGHASH_CP_KWOK=0 \
        in_ns "$HERE/control-plane.sh" up || fail "the control plane did not start in $NETNS"
    local kubectl=(in_ns "$BIN/kubectl" --kubeconfig "$CP/admin.kubeconfig")

    local n
    for ((n = 0; n < NODE_COUNT; n++)); do
        containerd_config "$n"
        kubelet_config "$n"
        start_node "$n"
        local image
        for image in "$NODE_BIN"/images/*.tar; do
            "$NODE_BIN/ctr" --address "$STATE/node-$n/containerd.sock" -n k8s.io images import \
                --no-unpack "$image" >/dev/null 2>>"$STATE/ctr.log" || fail "ctr images import $image failed (log: $STATE/ctr.log)"
        done
    done
    client_cert kube-proxy "/CN=system:kube-proxy"
    cat >"$STATE/kube-proxy.yaml" <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: iptables
clientConnection: {kubeconfig: "$STATE/kube-proxy.kubeconfig"}
hostnameOverride: $(node_name 0)
bindAddress: $(node_ip 0)
clusterCIDR: $CLUSTER_CIDR
healthzBindAddress: 127.0.0.1:10256
metricsBindAddress: 127.0.0.1:10249
conntrack: {maxPerCore: 0}
iptables: {syncPeriod: 5s, minSyncPeriod: 0s}
EOF
    start kube-proxy "$NODE_BIN/kube-proxy" --config "$STATE/kube-proxy.yaml"
    for ((n = 0; n < NODE_COUNT; n++)); do
        wait_for "node $(node_name "$n") to be Ready" 90 "kubelet-$n" \
            "${kubectl[@]}" wait --for=condition=Ready "node/$(node_name "$n")" --timeout=1s
    done
    wait_for "kube-proxy" 60 kube-proxy in_ns curl -sf http://127.0.0.1:10256/healthz
    say "up in $((SECONDS - began)) s: $NODE_COUNT nodes in namespace $NETNS; eval \"\$(scripts/node.sh env)\" then scripts/node.sh run kubectl ..."
}

# The pids of the processes whose network namespace has inode $1 (shims, containers, anything
# left), and the shims of this tier's containerds wherever they are.
in_namespace() {
    local pid
    for pid in /proc/[0-9]*; do
        pid=${pid#/proc/}
        [ "$pid" != $$ ] || continue
        if [ "$(stat -L -c %i "/proc/$pid/ns/net" 2>/dev/null)" = "$1" ] ||
            tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q "^[^ ]*containerd-shim-runc-v2 .*-address $STATE/"; then
            echo "$pid"
        fi
    done | paste -sd' ' -
}

# Every process of the tier: ours by pid, and any left in the namespace (shims, containers).
down() {
    local began=$SECONDS f pid
    for f in kube-proxy kubelet-1 kubelet-0; do stop_pid "$(pid_of "$f")" 5; done
    # Containers and their shims are in the namespace or in its pods' namespaces: end what runs
    # under the nodes' cgroups, then containerd.
    local n
    for n in 0 1; do
        local cg
        for cg in /sys/fs/cgroup/*/confighash-node-"$n"; do
            [ -d "$cg" ] || continue
            find "$cg" -name cgroup.procs -exec cat {} + 2>/dev/null | xargs -r kill -9 2>/dev/null || true
        done
    done
    for f in "$STATE"/node-*/containerd/state/io.containerd.runtime.v2.task/k8s.io/*/init.pid; do
        [ -f "$f" ] && kill -9 "$(cat "$f")" 2>/dev/null || true
    done
    # The shims: children of nobody once containerd is gone; found by their socket address.
    pkill -9 -f "containerd-shim-runc-v2 .*-address $STATE/" 2>/dev/null || true
    for f in containerd-1 containerd-0; do stop_pid "$(pid_of "$f")" 5; done
    pkill -9 -f "containerd-shim-runc-v2 .*-address $STATE/" 2>/dev/null || true
    if [ -f "$CP/etcd.pid" ]; then
        # kube-apiserver's graceful stop with kubelets attached takes about a minute: kill it.
        stop_pid "$(pid_of control-plane/kube-apiserver)" 3
        CONFIGHASH_CONTROL_PLANE_DIR="$CP" "$HERE/control-plane.sh" down || true
    fi
    # Anything else still in the namespace (a shim that a CRI call under way started late), until
    # none is left.
    if [ -e "/var/run/netns/$NETNS" ]; then
        local ns deadline=$((SECONDS + 15)) left
        ns=$(stat -L -c %i "/var/run/netns/$NETNS")
        while :; do
            left=$(in_namespace "$ns")
            [ -n "$left" ] || break
            [ "$SECONDS" -lt "$deadline" ] || fail "processes left in $NETNS: $left"
            kill -9 $left 2>/dev/null || true
            sleep 0.2
        done
    fi
    # Mounts under the state folder (secret and projected volumes, netns files, rootfs), deepest
    # first, then the cgroups.
    local m
    while read -r m; do
        umount -l "$m" 2>/dev/null || true
    done < <(awk -v dir="$STATE/" 'index($5, dir) == 1 {print $5}' /proc/self/mountinfo | sort -r)
    # The nodes' cgroups, once the processes killed above have left them.
    local deadline=$((SECONDS + 15))
    while compgen -G "/sys/fs/cgroup/*/confighash-node-*" >/dev/null && [ "$SECONDS" -lt "$deadline" ]; do
        for cg in /sys/fs/cgroup/*/confighash-node-*; do
            find "$cg" -name cgroup.procs -exec cat {} + 2>/dev/null | xargs -r kill -9 2>/dev/null || true
            find "$cg" -depth -type d -exec rmdir {} + 2>/dev/null || true
        done
        compgen -G "/sys/fs/cgroup/*/confighash-node-*" >/dev/null && sleep 0.2
    done
    ip netns del "$NETNS" 2>/dev/null || true
    # Nothing may be left: a mount, a cgroup, the namespace.
    local left=()
    mapfile -t left < <(awk -v dir="$STATE/" 'index($5, dir) == 1 {print "mount " $5}' /proc/self/mountinfo
        ls -d /sys/fs/cgroup/*/confighash-node-* 2>/dev/null | sed 's/^/cgroup /'
        ip netns list 2>/dev/null | awk -v ns="$NETNS" '$1 == ns {print "namespace " ns}')
    [ ${#left[@]} = 0 ] || fail "left after down: ${left[*]}"
    say "down in $((SECONDS - began)) s (logs kept in $STATE)"
}

env_() {
    [ -f "$CP/admin.kubeconfig" ] || fail "no cluster in $STATE: run 'scripts/node.sh up'"
    echo "export KUBECONFIG=$CP/admin.kubeconfig"
    echo "export CONFIGHASH_NODE_DIR=$STATE"
    echo "export CONFIGHASH_E2E_AUDIT_LOG=$CP/audit.log"
    echo "export PATH=$(cat "$STATE/bin"):$(cat "$STATE/node-bin"):\$PATH"
}

# kill -9 of node N's kubelet and containerd, then both started again with the same state: the
# pods keep running under their shims.
restart_node() {
    local n="$1"
    [[ "$n" =~ ^[01]$ ]] || usage
    NODE_BIN=$(cat "$STATE/node-bin")
    kill -9 "$(pid_of "kubelet-$n")" "$(pid_of "containerd-$n")" 2>/dev/null || true
    while pid_alive "$(pid_of "kubelet-$n")" || pid_alive "$(pid_of "containerd-$n")"; do sleep 0.05; done
    start_node "$n"
}

case "${1:-}" in
up) up ;;
down) down ;;
env) env_ ;;
run)
    shift
    [ $# -gt 0 ] || usage
    in_ns "$@"
    ;;
restart-node)
    [ $# = 2 ] || usage
    restart_node "$2"
    ;;
*) usage ;;
esac
