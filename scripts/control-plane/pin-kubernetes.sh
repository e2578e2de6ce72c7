#!/usr/bin/env bash
# Writes the wrapper module that builds one Kubernetes release from the Go module proxy:
# scripts/control-plane/kubernetes/<version>/go.mod and go.sum, committed beside the others.
#
# k8s.io/kubernetes replaces its staging modules (k8s.io/api, client-go, ...) with folders of its
# own repository, so `go install k8s.io/kubernetes/cmd/...@v1.37.2` is refused. The wrapper module
# requires k8s.io/kubernetes at the version, points each staging module its go.mod names at the
# matching published version (v0.<minor>.<patch>), lists the programs as `tool`s and lets
# `go mod tidy` pin the rest.
#
# Some staging modules are refused by the proxy at some patches (k8s.io/endpointslice v0.32.13,
# say). Pin another patch of the same minor for such a module with STAGING_OVERRIDES:
#
#   scripts/control-plane/pin-kubernetes.sh 1.37.2
#   STAGING_OVERRIDES="k8s.io/endpointslice=v0.32.12" scripts/control-plane/pin-kubernetes.sh 1.32.13
#
# Run it when adding a version to scripts/lib/versions.sh; the install scripts never run it.
set -euo pipefail

version="${1:?usage: pin-kubernetes.sh <version, e.g. 1.37.2>}"
[[ "$version" =~ ^1\.[0-9]+\.[0-9]+$ ]] || { echo "pin-kubernetes.sh: not a version: $version" >&2; exit 2; }
HERE="$(cd "$(dirname "$0")" && pwd)"
dest="$HERE/kubernetes/$version"
staging_version="v0.${version#1.}"

say() { echo "pin-kubernetes.sh: $*" >&2; }

command -v go >/dev/null || { say "Go is needed"; exit 1; }
modfile=$(cd /tmp && GOFLAGS=-mod=mod go mod download -json "k8s.io/kubernetes@v$version" |
    sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",$/\1/p')
[ -f "$modfile" ] || { say "the module proxy has no k8s.io/kubernetes v$version"; exit 1; }
go_line=$(sed -n 's/^go \([0-9.]*\)$/\1/p' "$modfile" | head -1)
mapfile -t staging < <(sed -n 's|^[[:space:]]*\(k8s.io/[a-z0-9-]*\) => ./staging/.*|\1|p' "$modfile")
[ "${#staging[@]}" -gt 0 ] || { say "k8s.io/kubernetes v$version names no staging modules"; exit 1; }

override_of() {
    local o
    for o in ${STAGING_OVERRIDES:-}; do
        [ "${o%%=*}" = "$1" ] && { echo "${o#*=}"; return; }
    done
    echo "$staging_version"
}

mkdir -p "$dest"
{
    echo "module confighash.local/tools/kubernetes"
    echo
    echo "go $go_line"
    echo
    for m in "${staging[@]}"; do
        echo "replace $m => $m $(override_of "$m")"
        echo
    done
    echo "require k8s.io/kubernetes v$version"
    echo
    echo "tool ("
    for p in kube-apiserver kube-controller-manager kube-proxy kube-scheduler kubectl kubelet; do
        echo "	k8s.io/kubernetes/cmd/$p"
    done
    echo ")"
} >"$dest/go.mod"
: >"$dest/go.sum"
(cd "$dest" && GOFLAGS=-mod=mod go mod tidy) || { say "go mod tidy failed in $dest"; exit 1; }
say "pinned Kubernetes $version in scripts/control-plane/kubernetes/$version (${#staging[@]} staging modules)"
