# Sourced by the install scripts: the linker flags that give Kubernetes programs built from the
# k8s.io/kubernetes module the version `--version` reports (as its own release builds set them).
#   ldflags=$(kubernetes_ldflags 1.34.4)
kubernetes_ldflags() {
    local version="$1" minor="${1#*.}"
    echo "-X k8s.io/component-base/version.gitVersion=v$version" \
        "-X k8s.io/component-base/version.gitMajor=${version%%.*}" \
        "-X k8s.io/component-base/version.gitMinor=${minor%%.*}" \
        "-X k8s.io/component-base/version.gitTreeState=clean"
}
