#!/usr/bin/env bash
# Builds what a real Kubernetes node needs into a cache folder and prints that folder.
#
# - kubelet and kube-proxy (Kubernetes 1.37.2, the newest of scripts/lib/versions.sh: the control
#   plane's version) from the wrapper module scripts/control-plane/kubernetes/<version>, as
#   install-control-plane.sh builds the control plane. kubelet 1.35 and later refuse cgroup v1
#   unless told otherwise: scripts/node.sh sets `failCgroupV1: false` in its configuration;
# - containerd, containerd-shim-runc-v2 and ctr (2.4.2) from the wrapper module
#   scripts/control-plane/containerd. containerd 2 rather than Debian's 1.6: Kubernetes 1.36 drops
#   containerd 1.x, and a Go module pins the version on every machine where a Debian package
#   follows the distribution's updates;
# - the pod sandbox image (a static pause program, scripts/node/pause.c) and the examples' app
#   image (Debian's static busybox and scripts/node/app.sh), as archives `ctr images import` reads;
# - from Debian, installed with apt-get when missing (they are only packaged there): runc, the CNI
#   plugins (bridge, host-local, loopback, portmap), iptables and conntrack for kube-proxy, and
#   busybox-static. Their versions are checked against the minors pinned below.
#
# Safe to run from several callers at once (a file lock); a finished build is reused without the
# network.
#
#   NODE=$(scripts/install-node.sh)
set -euo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=lib/versions.sh
. "$HERE/lib/versions.sh"
KUBERNETES_VERSION=$KUBERNETES_NEWEST
CONTAINERD_VERSION=2.4.2
RUNC_MINOR=1.1
CNI_MINOR=1.1
MODULES="$HERE/control-plane"
K8S_MODULE="kubernetes/$KUBERNETES_VERSION"
TOOLS="${CONFIGHASH_TOOLS:-${XDG_CACHE_HOME:-$HOME/.cache}/confighash-tools}"
SUM=$(cat "$MODULES/$K8S_MODULE"/go.mod "$MODULES/$K8S_MODULE"/go.sum "$MODULES"/containerd/go.mod \
    "$MODULES"/containerd/go.sum "$HERE"/node/pause.c "$HERE"/node/app.sh "$HERE"/oci-archive.py "$HERE"/install-node.sh | sha256sum | cut -c1-12)
DEST="$TOOLS/node-$KUBERNETES_VERSION-$CONTAINERD_VERSION-$SUM"
PROGRAMS=(kubelet kube-proxy containerd containerd-shim-runc-v2 ctr)
# Debian's packages and a file each must have.
PACKAGES=(runc:/usr/sbin/runc containernetworking-plugins:/usr/lib/cni/bridge iptables:/usr/sbin/iptables
    conntrack:/usr/sbin/conntrack busybox-static:/bin/busybox)
PAUSE_IMAGE=registry.k8s.io/pause:3.10
APP_IMAGE=localhost/confighash-test-app:1

say() { echo "install-node.sh: $*" >&2; }
fail() {
    say "$*"
    exit 1
}

installed() {
    [ -f "$DEST/.complete" ] || return 1
    local p
    for p in "${PROGRAMS[@]}"; do [ -x "$DEST/$p" ] || return 1; done
    for p in "${PACKAGES[@]}"; do [ -x "${p#*:}" ] || return 1; done
}

if installed; then
    echo "$DEST"
    exit 0
fi
mkdir -p "$TOOLS"
exec 9>"$TOOLS/node.lock"
flock 9
if installed; then
    echo "$DEST"
    exit 0
fi
command -v go >/dev/null || fail "Go is needed (go 1.26 or later on PATH) to build the node"
command -v gcc >/dev/null || fail "gcc is needed to build the pause program"
command -v python3 >/dev/null || fail "python3 is needed to write the images (scripts/oci-archive.py)"
start=$(date +%s)

missing=()
for p in "${PACKAGES[@]}"; do [ -x "${p#*:}" ] || missing+=("${p%%:*}"); done
if [ ${#missing[@]} -gt 0 ]; then
    say "installing Debian's ${missing[*]}"
    command -v apt-get >/dev/null || fail "apt-get is needed to install ${missing[*]} (Debian's packages)"
    [ "$(id -u)" = 0 ] || fail "root is needed to install ${missing[*]} with apt-get"
    { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}"; } >&2 ||
        fail "apt-get install ${missing[*]} failed"
fi
runc_version=$(runc --version | sed -n 's/^runc version //p')
[[ "$runc_version" == "$RUNC_MINOR".* ]] || fail "runc is $runc_version, not $RUNC_MINOR.x"
cni_version=$(CNI_COMMAND=VERSION /usr/lib/cni/bridge </dev/null | python3 -c 'import json,sys; print(json.load(sys.stdin)["cniVersion"])' 2>/dev/null || true)
cni_plugins=$(dpkg-query -W -f '${Version}' containernetworking-plugins 2>/dev/null || true)
[[ "$cni_plugins" == "$CNI_MINOR".* ]] || fail "the CNI plugins are ${cni_plugins:-unknown}, not $CNI_MINOR.x"

work=$(mktemp -d "$TOOLS/node-build.XXXXXX")
trap 'rm -rf "$work"' EXIT

# shellcheck source=lib/kubernetes-ldflags.sh
. "$HERE/lib/kubernetes-ldflags.sh"
k8s_ldflags=$(kubernetes_ldflags "$KUBERNETES_VERSION")
say "building kubelet and kube-proxy (module $K8S_MODULE)"
(cd "$MODULES/$K8S_MODULE" && GOFLAGS=-mod=readonly go build -trimpath -ldflags "-s -w $k8s_ldflags" -o "$work/" \
    k8s.io/kubernetes/cmd/kubelet k8s.io/kubernetes/cmd/kube-proxy) ||
    fail "go build in scripts/control-plane/$K8S_MODULE failed (see above)"
say "building containerd $CONTAINERD_VERSION (module containerd)"
(cd "$MODULES/containerd" && CGO_ENABLED=0 GOFLAGS=-mod=readonly go build -trimpath \
    -ldflags "-s -w -X github.com/containerd/containerd/v2/version.Version=v$CONTAINERD_VERSION" -o "$work/" \
    github.com/containerd/containerd/v2/cmd/containerd github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2 \
    github.com/containerd/containerd/v2/cmd/ctr) ||
    fail "go build in scripts/control-plane/containerd failed (see above)"

for p in kubelet kube-proxy; do
    v=$("$work/$p" --version 2>/dev/null | sed -n 's/^Kubernetes //p')
    [ "$v" = "v$KUBERNETES_VERSION" ] || fail "$p reports version ${v:-none}, not v$KUBERNETES_VERSION"
done
v=$("$work/containerd" --version | awk '{print $3}')
[ "$v" = "v$CONTAINERD_VERSION" ] || fail "containerd reports version ${v:-none}, not v$CONTAINERD_VERSION"

gcc -static -O2 -o "$work/pause" "$HERE/node/pause.c" || fail "gcc -static scripts/node/pause.c failed"
mkdir -p "$work/images"
python3 "$HERE/oci-archive.py" --out "$work/images/pause.tar" --name "$PAUSE_IMAGE" \
    --file "$work/pause:/pause:0755" --user 65535:65535 --entrypoint '["/pause"]' >/dev/null ||
    fail "could not write the pause image"
app=(--out "$work/images/app.tar" --name "$APP_IMAGE" --file /bin/busybox:/bin/busybox:0755
    --file "$HERE/node/app.sh:/bin/tier-app:0755" --dir /tmp:1777 --user 65534:65534 --entrypoint '["/bin/tier-app"]'
    --text "/etc/passwd=root:x:0:0:root:/root:/bin/sh
nobody:x:65534:65534:nobody:/nonexistent:/bin/sh
" --text "/etc/group=root:x:0:
nobody:x:65534:
")
for applet in sh cat env sleep grep ls wget httpd nc echo test; do
    app+=(--symlink "/bin/$applet:busybox")
done
python3 "$HERE/oci-archive.py" "${app[@]}" >/dev/null || fail "could not write the app image"
printf '%s\n' "$PAUSE_IMAGE" >"$work/images/pause.name"
printf '%s\n' "$APP_IMAGE" >"$work/images/app.name"

say "kubelet, kube-proxy v$KUBERNETES_VERSION; containerd v$CONTAINERD_VERSION; runc $runc_version; CNI plugins $cni_plugins (spec $cni_version)"
touch "$work/.complete"
rm -rf "$DEST"
mv "$work" "$DEST"
trap - EXIT
say "built in $(($(date +%s) - start)) s into $DEST"
echo "$DEST"
