#!/usr/bin/env bash
# The gitops tier: the seed's story through the real GitOps engines. Flux (source-controller and
# kustomize-controller) and Argo CD (application-controller, repo-server, redis), built here
# (scripts/install-gitops.sh), sync the examples from a git repository served inside the real-node
# tier's network namespace, with confighash installed as the quick start says; the checks are
# tests/node/gitops.py, on the cluster scripts/node-tier.sh brings up.
#
#   scripts/gitops-tier.sh                      # build, start, check, stop
#   NODE_ONLY=flux scripts/gitops-tier.sh       # one engine (flux or argo_cd)
#   CONFIGHASH_NODE_KEEP=1 scripts/gitops-tier.sh
#
# Fails (never skips) when something it needs cannot be had. The engines run only inside the
# namespace, which has no link out (Argo CD's application-controller listens on every address).
set -euo pipefail

HERE="$(cd "$(dirname "$0")" && pwd)"
say() { echo "gitops-tier.sh: $*" >&2; }
GITOPS_BIN=$("$HERE/install-gitops.sh") || {
    say "scripts/install-gitops.sh failed"
    exit 1
}
export GITOPS_BIN GITOPS_GIT_SERVER="$HERE/node/git-server.py"
exec "$HERE/node-tier.sh" tests/node/gitops.py
