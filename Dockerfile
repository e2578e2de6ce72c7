# syntax=docker/dockerfile:1
# The confighash image: `docker build -t confighash:0.1.0 .`, or for both architectures
# `docker buildx build --platform linux/amd64,linux/arm64 .` (what .github/workflows/release.yml
# runs).
#
# Builder: the official Rust image (Debian 12, the same glibc as the runtime image), run on the
# build machine's own platform ($BUILDPLATFORM) and cross-compiling for the image's
# ($TARGETARCH) with Debian's cross toolchain: no emulation, so an arm64 image builds as fast as
# an amd64 one. It builds with the command CI uses. The cache mounts keep the crate registry and
# (per target architecture) the target directory between builds, so a source change does not
# download and rebuild every dependency.
FROM --platform=$BUILDPLATFORM docker.io/library/rust:1.95-bookworm AS builder
ARG TARGETARCH
ARG BUILDARCH
WORKDIR /src
# The Rust target and the cross C toolchain for it (ring compiles C and assembly).
RUN --mount=type=cache,target=/var/cache/apt,sharing=locked,id=confighash-apt-$BUILDARCH \
    --mount=type=cache,target=/var/lib/apt/lists,sharing=locked,id=confighash-apt-lists-$BUILDARCH \
    set -eu; \
    case "$TARGETARCH" in \
      amd64) rust_target=x86_64-unknown-linux-gnu; gnu=x86-64-linux-gnu; libc=amd64 ;; \
      arm64) rust_target=aarch64-unknown-linux-gnu; gnu=aarch64-linux-gnu; libc=arm64 ;; \
      *) echo "unsupported architecture: $TARGETARCH" >&2; exit 1 ;; \
    esac; \
    echo "$rust_target" > /rust-target; \
    if [ "$TARGETARCH" != "$BUILDARCH" ]; then \
      rm -f /etc/apt/apt.conf.d/docker-clean; \
      apt-get update; \
      apt-get install -y --no-install-recommends "gcc-$gnu" "libc6-dev-$libc-cross"; \
    fi; \
    rustup target add "$rust_target"
ENV CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc \
    CC_aarch64_unknown_linux_gnu=aarch64-linux-gnu-gcc \
    CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_LINKER=x86_64-linux-gnu-gcc \
    CC_x86_64_unknown_linux_gnu=x86_64-linux-gnu-gcc
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry,id=confighash-cargo-registry \
    --mount=type=cache,target=/usr/local/cargo/git,id=confighash-cargo-git \
    --mount=type=cache,target=/src/target,id=confighash-target-$TARGETARCH \
    set -eu; \
    rust_target=$(cat /rust-target); \
    if [ "$TARGETARCH" = "$BUILDARCH" ]; then \
      unset CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER CC_aarch64_unknown_linux_gnu \
            CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_LINKER CC_x86_64_unknown_linux_gnu; \
    fi; \
    cargo build --release --locked --target "$rust_target" --bin confighash; \
    cp "target/$rust_target/release/confighash" /confighash

# Runtime: distroless with glibc and CA certificates, no shell, no package manager; pulled for
# the image's platform.
FROM gcr.io/distroless/cc-debian12:nonroot
# The release sets the version (`--build-arg VERSION=1.2.3`); a local build is the Cargo.toml's.
ARG VERSION=0.1.0
LABEL org.opencontainers.image.title="confighash" \
      org.opencontainers.image.description="Roll Kubernetes workloads when their ConfigMaps and Secrets change" \
      org.opencontainers.image.source="https://github.com/confighash/confighash" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.version="$VERSION"
COPY --from=builder /confighash /confighash
# The same user and group as deploy/base/deployment.yaml (runAsUser 65534).
USER 65534:65534
# 8443: the webhook (HTTPS); 8080: the admin port (/livez, /readyz, /metrics).
EXPOSE 8443 8080
ENTRYPOINT ["/confighash"]
