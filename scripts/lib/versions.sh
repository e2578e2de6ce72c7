# Sourced by the install scripts: the Kubernetes releases the project runs (docs/compatibility.md).
#
# Every tier runs the newest (the last). scripts/compatibility.sh runs the stories and the e2e
# scenarios on each; CI runs the oldest with the stories on every change. The policy: the three
# minors upstream supports and the three before them that managed clusters' extended support
# still runs, each at the newest patch the Go module proxy serves whole. Each has its wrapper
# module under scripts/control-plane/kubernetes/<version> (scripts/control-plane/pin-kubernetes.sh).
KUBERNETES_VERSIONS=(1.32.13 1.33.13 1.34.4 1.35.4 1.36.3 1.37.2)
KUBERNETES_NEWEST=${KUBERNETES_VERSIONS[${#KUBERNETES_VERSIONS[@]} - 1]}
KUBERNETES_OLDEST=${KUBERNETES_VERSIONS[0]}

# The version a script builds: CONFIGHASH_KUBERNETES_VERSION when set (one of the list, or its
# minor: "1.33"), else the newest. Prints it, or fails naming the list.
kubernetes_version() {
    local want="${CONFIGHASH_KUBERNETES_VERSION:-$KUBERNETES_NEWEST}" v
    for v in "${KUBERNETES_VERSIONS[@]}"; do
        if [ "$v" = "$want" ] || [ "${v%.*}" = "$want" ]; then
            echo "$v"
            return 0
        fi
    done
    echo "CONFIGHASH_KUBERNETES_VERSION=$want is not one of ${KUBERNETES_VERSIONS[*]} (scripts/lib/versions.sh)" >&2
    return 1
}
