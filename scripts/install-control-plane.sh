#!/usr/bin/env bash
# Builds a Kubernetes control plane from Go modules into a cache folder and prints that folder.
#
# kube-apiserver, kube-controller-manager, kube-scheduler and kubectl (Kubernetes 1.37.2, the
# newest of scripts/lib/versions.sh), etcd (3.6.16) and kwok (0.8.0, fake nodes whose pods turn
# Ready) are Go programs in modules the Go module proxy serves. k8s.io/kubernetes replaces its
# staging modules with local folders, so `go install` refuses it; the wrapper modules under
# scripts/control-plane/ (go.mod and go.sum committed; one per Kubernetes release under
# kubernetes/<version>) point each staging module at its published version and list the programs
# as tools. kwok's stage definitions (node initialize and heartbeat, pod ready, complete and
# delete) are copied beside the binaries.
#
# CONFIGHASH_KUBERNETES_VERSION=1.32 (or 1.32.13) builds an older release of the list: only its
# three API-server-side programs (kube-apiserver, kube-controller-manager, kube-scheduler); kubectl,
# etcd and kwok are the newest build's, copied beside them (kubectl supports one minor of skew
# either way; the tiers use it for nothing an older server lacks).
#
# Safe to run from several callers at once: a file lock serialises builds, and a finished build
# is reused without the network. KUBEBUILDER_ASSETS (envtest's folder of etcd, kube-apiserver and
# kubectl), when set, supplies those three; they must be of the pinned minor versions.
#
#   BIN=$(scripts/install-control-plane.sh)
#   CONFIGHASH_KUBERNETES_VERSION=1.32 scripts/install-control-plane.sh   # the oldest supported
#   CONFIGHASH_TOOLS=/some/dir scripts/install-control-plane.sh   # another cache folder
set -euo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
# shellcheck source=lib/versions.sh
. "$HERE/lib/versions.sh"
KUBERNETES_VERSION=$(kubernetes_version)
ETCD_VERSION=3.6.16
KWOK_VERSION=0.8.0
MODULES="$HERE/control-plane"
K8S_MODULE="kubernetes/$KUBERNETES_VERSION"
TOOLS="${CONFIGHASH_TOOLS:-${XDG_CACHE_HOME:-$HOME/.cache}/confighash-tools}"
# The wrapper modules' content is part of the name: a changed go.mod or go.sum builds anew.
SUM=$(cat "$MODULES/$K8S_MODULE"/go.mod "$MODULES/$K8S_MODULE"/go.sum "$MODULES"/etcd/go.mod \
    "$MODULES"/etcd/go.sum "$MODULES"/kwok/go.mod "$MODULES"/kwok/go.sum | sha256sum | cut -c1-12)
DEST="$TOOLS/control-plane-$KUBERNETES_VERSION-$ETCD_VERSION-$KWOK_VERSION-$SUM"
PROGRAMS=(etcd kube-apiserver kube-controller-manager kube-scheduler kubectl kwok)
STAGES=(node/fast/node-initialize.yaml node/heartbeat/node-heartbeat.yaml
    pod/fast/pod-ready.yaml pod/fast/pod-complete.yaml pod/fast/pod-delete.yaml)
older=false
if [ "$KUBERNETES_VERSION" != "$KUBERNETES_NEWEST" ]; then
    older=true
    # Its kubectl, etcd and kwok are the newest build's: a new newest builds it anew.
    SUM=$( (echo "$SUM"; cat "$MODULES/kubernetes/$KUBERNETES_NEWEST"/go.mod \
        "$MODULES/kubernetes/$KUBERNETES_NEWEST"/go.sum) | sha256sum | cut -c1-12)
    DEST="$TOOLS/control-plane-$KUBERNETES_VERSION-$ETCD_VERSION-$KWOK_VERSION-$SUM"
fi

say() { echo "install-control-plane.sh: $*" >&2; }
fail() { say "$*"; exit 1; }

# The version each program reports, on one line.
version_of() {
    case "$1" in
    etcd) "$2" --version 2>/dev/null | sed -n 's/^etcd Version: //p' ;;
    kubectl) "$2" version --client -o json 2>/dev/null | sed -n 's/.*"gitVersion": *"\([^"]*\)".*/\1/p' | head -1 ;;
    kwok) "$2" --version 2>/dev/null | sed -n 's/.*[Vv]ersion[: ]*v\{0,1\}\([0-9][^ ,]*\).*/\1/p' | head -1 ;;
    *) "$2" --version 2>/dev/null | sed -n 's/^Kubernetes //p' ;;
    esac
}

# Whether a program's version is the one pinned (for KUBEBUILDER_ASSETS: the same minor).
version_ok() {
    local version="$2" want
    case "$1" in
    etcd) want=$ETCD_VERSION ;;
    kwok) want=$KWOK_VERSION ;;
    kubectl) want=v$KUBERNETES_NEWEST ;;
    *) want=v$KUBERNETES_VERSION ;;
    esac
    if [ "${3:-exact}" = minor ]; then
        [ "${version%.*}" = "${want%.*}" ]
    else
        [ "$version" = "$want" ]
    fi
}

installed() {
    [ -f "$DEST/.complete" ] || return 1
    for p in "${PROGRAMS[@]}"; do
        [ -x "$DEST/$p" ] || return 1
    done
}

if installed; then
    echo "$DEST"
    exit 0
fi

mkdir -p "$TOOLS"
exec 9>"$TOOLS/control-plane.lock"
flock 9
# Another caller may have built it while this one waited for the lock.
if installed; then
    echo "$DEST"
    exit 0
fi

[ -f "$MODULES/$K8S_MODULE/go.mod" ] || fail "no wrapper module scripts/control-plane/$K8S_MODULE"
command -v go >/dev/null || fail "Go is needed (go 1.26 or later on PATH) to build the control plane"
newest=""
if $older; then
    # The newest build, for kubectl, etcd and kwok (built first, under its own lock).
    flock -u 9
    newest=$(CONFIGHASH_KUBERNETES_VERSION="$KUBERNETES_NEWEST" "$HERE/install-control-plane.sh") ||
        fail "building Kubernetes $KUBERNETES_NEWEST (for kubectl, etcd and kwok) failed"
    flock 9
fi
start=$(date +%s)
work=$(mktemp -d "$TOOLS/control-plane-build.XXXXXX")
trap 'rm -rf "$work"' EXIT

assets=()
if [ -n "${KUBEBUILDER_ASSETS:-}" ]; then
    for p in etcd kube-apiserver kubectl; do
        [ -x "$KUBEBUILDER_ASSETS/$p" ] || fail "KUBEBUILDER_ASSETS=$KUBEBUILDER_ASSETS has no $p"
        v=$(version_of "$p" "$KUBEBUILDER_ASSETS/$p")
        version_ok "$p" "$v" minor ||
            fail "KUBEBUILDER_ASSETS/$p is version ${v:-unknown}; this tier is pinned to the minor of $([ "$p" = etcd ] && echo "$ETCD_VERSION" || echo "$KUBERNETES_VERSION")"
        cp "$KUBEBUILDER_ASSETS/$p" "$work/$p"
        assets+=("$p")
    done
    say "using etcd, kube-apiserver and kubectl from KUBEBUILDER_ASSETS=$KUBEBUILDER_ASSETS"
fi
have() { [[ " ${assets[*]} " == *" $1 "* ]]; }

build() {
    local module="$1" ldflags="$2"
    shift 2
    say "building $* (module $module)"
    (cd "$MODULES/$module" && GOFLAGS=-mod=readonly go build -trimpath -ldflags "-s -w $ldflags" -o "$work/" "$@") ||
        fail "go build in scripts/control-plane/$module failed (see above)"
}

# shellcheck source=lib/kubernetes-ldflags.sh
. "$HERE/lib/kubernetes-ldflags.sh"
k8s_ldflags=$(kubernetes_ldflags "$KUBERNETES_VERSION")
k8s_packages=()
for p in kube-apiserver kube-controller-manager kube-scheduler kubectl; do
    if $older && [ "$p" = kubectl ]; then continue; fi
    have "$p" || k8s_packages+=("k8s.io/kubernetes/cmd/$p")
done
build "$K8S_MODULE" "$k8s_ldflags" "${k8s_packages[@]}"
if $older; then
    for p in etcd kubectl kwok; do
        have "$p" || cp "$newest/$p" "$work/$p"
    done
    cp -r "$newest/kwok-stages" "$work/kwok-stages"
else
    have etcd || build etcd "" go.etcd.io/etcd/server/v3
    # etcd's main package is the module's root, go.etcd.io/etcd/server/v3: go names it `server`.
    if ! have etcd; then
        mv "$work/server" "$work/etcd"
    fi
    build kwok "-X sigs.k8s.io/kwok/pkg/consts.Version=$KWOK_VERSION" sigs.k8s.io/kwok/cmd/kwok

    stage_src=$(cd "$MODULES/kwok" && go list -m -f '{{.Dir}}' sigs.k8s.io/kwok)/kustomize/stage
    mkdir -p "$work/kwok-stages"
    for s in "${STAGES[@]}"; do
        cp "$stage_src/$s" "$work/kwok-stages/$(basename "$s")" || fail "kwok's module has no stage $s"
    done
fi

for p in "${PROGRAMS[@]}"; do
    v=$(version_of "$p" "$work/$p")
    if have "$p"; then
        version_ok "$p" "$v" minor || fail "$p reports version ${v:-none}"
    else
        version_ok "$p" "$v" || fail "$p reports version ${v:-none}, not the pinned one"
    fi
    say "$p $v"
done

touch "$work/.complete"
rm -rf "$DEST"
# Rename into place, so that a caller that does not take the lock never sees half a build.
mv "$work" "$DEST"
trap - EXIT
say "built in $(($(date +%s) - start)) s into $DEST"
echo "$DEST"
