#!/usr/bin/env bash
# Builds the GitOps engines the gitops tier syncs the examples with into a cache folder and
# prints that folder.
#
# - Flux: source-controller and kustomize-controller 1.9.6, each from its wrapper module under
#   scripts/gitops/ (go.mod and go.sum committed). source-controller 1.9.6 requires
#   github.com/fluxcd/pkg/artifact v0.18.3, which the Go module proxy does not serve: its wrapper
#   replaces it with v0.18.0 (GitRepository sources work with it; Helm and OCI sources are not used
#   here). Each wrapper copies its module's own replace directives, which `go build` of a
#   dependency would ignore. Their CRDs (config/crd/bases) are copied beside the binaries.
# - Argo CD 3.6.1: the one `argocd` binary (application-controller and repo-server by the name it
#   is called by) from scripts/gitops/argo-cd, which copies argo-cd's replace block and requires
#   the published gitops-engine module in place of argo-cd's ./gitops-engine folder. Argo CD 3.6
#   declares go 1.27: the build runs with GOTOOLCHAIN=go1.27.3 (fetched from the module proxy).
#   Its CRDs (manifests/crds) and hack/git-verify-wrapper.sh (which the repo-server runs for every
#   revision) are copied beside it.
# - From Debian, installed with apt-get when missing: redis (Argo CD's cache) and git (the tier's
#   git server is `git http-backend`; Argo CD's repo-server runs git).
#
# Versions are checked from the binaries' build information (`go version -m`). Builds run one
# after another (beside another build they take three times as long). Safe to run from several
# callers at once (a file lock); a finished build is reused without the network.
#
#   GITOPS=$(scripts/install-gitops.sh)
set -euo pipefail

FLUX_SOURCE_VERSION=1.9.6
FLUX_KUSTOMIZE_VERSION=1.9.6
ARGO_CD_VERSION=3.6.1
ARGO_CD_TOOLCHAIN=go1.27.3
REDIS_MINOR=7.0
HERE="$(cd "$(dirname "$0")" && pwd)"
MODULES="$HERE/gitops"
TOOLS="${CONFIGHASH_TOOLS:-${XDG_CACHE_HOME:-$HOME/.cache}/confighash-tools}"
SUM=$(cat "$MODULES"/*/go.mod "$MODULES"/*/go.sum "$HERE/install-gitops.sh" | sha256sum | cut -c1-12)
DEST="$TOOLS/gitops-flux$FLUX_SOURCE_VERSION-argocd$ARGO_CD_VERSION-$SUM"
PROGRAMS=(source-controller kustomize-controller argocd)
PACKAGES=(redis-server:/usr/bin/redis-server git:/usr/bin/git)

say() { echo "install-gitops.sh: $*" >&2; }
fail() {
    say "$*"
    exit 1
}

installed() {
    [ -f "$DEST/.complete" ] || return 1
    local p
    for p in "${PROGRAMS[@]}"; do [ -x "$DEST/$p" ] || return 1; done
    for p in "${PACKAGES[@]}"; do [ -x "${p#*:}" ] || return 1; done
    [ -x /usr/lib/git-core/git-http-backend ]
}

if installed; then
    echo "$DEST"
    exit 0
fi
mkdir -p "$TOOLS"
exec 9>"$TOOLS/gitops.lock"
flock 9
if installed; then
    echo "$DEST"
    exit 0
fi
command -v go >/dev/null || fail "Go is needed (go 1.26 or later on PATH) to build the engines"
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
redis_version=$(redis-server --version | sed -n 's/.* v=\([0-9.]*\).*/\1/p')
[[ "$redis_version" == "$REDIS_MINOR".* ]] || fail "redis is ${redis_version:-unknown}, not $REDIS_MINOR.x"
[ -x /usr/lib/git-core/git-http-backend ] || fail "git has no /usr/lib/git-core/git-http-backend"

work=$(mktemp -d "$TOOLS/gitops-build.XXXXXX")
trap 'rm -rf "$work"' EXIT

# build MODULE OUTPUT PACKAGE [ENV...]
build() {
    local module="$1" out="$2" package="$3" began=$SECONDS
    shift 3
    say "building $package (module scripts/gitops/$module)"
    (cd "$MODULES/$module" && env "$@" GOFLAGS=-mod=readonly go build -trimpath -ldflags "-s -w ${LDFLAGS:-}" -o "$work/$out" "$package") ||
        fail "go build in scripts/gitops/$module failed (see above)"
    say "built $out in $((SECONDS - began)) s"
}

# The version of MODULE a binary was built with, from its build information.
built_version() {
    go version -m "$1" | awk -v m="$2" '($1 == "mod" || $1 == "dep") && $2 == m { print $3 }'
}

# module_dir MODULE-FOLDER MODULE [ENV...]: where the Go module cache holds a dependency.
module_dir() {
    local folder="$1" module="$2"
    shift 2
    (cd "$MODULES/$folder" && env "$@" go list -m -f '{{.Dir}}' "$module")
}

build flux-source-controller source-controller github.com/fluxcd/source-controller
build flux-kustomize-controller kustomize-controller github.com/fluxcd/kustomize-controller
LDFLAGS="-X github.com/argoproj/argo-cd/v3/common.version=$ARGO_CD_VERSION" \
    build argo-cd argocd github.com/argoproj/argo-cd/v3/cmd GOTOOLCHAIN="$ARGO_CD_TOOLCHAIN"

v=$(built_version "$work/source-controller" github.com/fluxcd/source-controller)
[ "$v" = "v$FLUX_SOURCE_VERSION" ] || fail "source-controller was built from ${v:-no version}, not v$FLUX_SOURCE_VERSION"
v=$(built_version "$work/kustomize-controller" github.com/fluxcd/kustomize-controller)
[ "$v" = "v$FLUX_KUSTOMIZE_VERSION" ] || fail "kustomize-controller was built from ${v:-no version}, not v$FLUX_KUSTOMIZE_VERSION"
v=$(built_version "$work/argocd" github.com/argoproj/argo-cd/v3)
[ "$v" = "v$ARGO_CD_VERSION" ] || fail "argocd was built from ${v:-no version}, not v$ARGO_CD_VERSION"
# The binary picks what it runs from the name it is called by.
for name in argocd-application-controller argocd-repo-server argocd-git-ask-pass; do
    ln -s argocd "$work/$name"
done

mkdir -p "$work/crds/flux" "$work/crds/argo-cd" "$work/bin"
src=$(module_dir flux-source-controller github.com/fluxcd/source-controller)
cp "$src"/config/crd/bases/*.yaml "$work/crds/flux/" || fail "source-controller's module has no CRDs"
src=$(module_dir flux-kustomize-controller github.com/fluxcd/kustomize-controller)
cp "$src"/config/crd/bases/*.yaml "$work/crds/flux/" || fail "kustomize-controller's module has no CRDs"
src=$(module_dir argo-cd github.com/argoproj/argo-cd/v3 GOTOOLCHAIN="$ARGO_CD_TOOLCHAIN")
cp "$src"/manifests/crds/app*-crd.yaml "$work/crds/argo-cd/" || fail "argo-cd's module has no CRDs"
install -m 0755 "$src/hack/git-verify-wrapper.sh" "$work/bin/git-verify-wrapper.sh"
chmod -R u+w "$work/crds"

say "source-controller v$FLUX_SOURCE_VERSION, kustomize-controller v$FLUX_KUSTOMIZE_VERSION, argocd v$ARGO_CD_VERSION; redis $redis_version; $(git --version)"
touch "$work/.complete"
rm -rf "$DEST"
mv "$work" "$DEST"
trap - EXIT
say "built in $(($(date +%s) - start)) s into $DEST"
echo "$DEST"
