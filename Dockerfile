# syntax=docker/dockerfile:1
# The confighash image: `docker build -t confighash:0.1.0 .`
#
# Builder: the official Rust image (Debian 12, the same glibc as the runtime image), building
# with the command CI uses. The cache mounts keep the crate registry and the target directory
# between builds, so a source change does not download and rebuild every dependency.
FROM docker.io/library/rust:1.95-bookworm AS builder
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/usr/local/cargo/git \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked --bin confighash \
    && cp target/release/confighash /confighash

# Runtime: distroless with glibc and CA certificates, no shell, no package manager.
FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=builder /confighash /confighash
# The same user and group as deploy/base/deployment.yaml (runAsUser 65534).
USER 65534:65534
# 8443: the webhook (HTTPS); 8080: the admin port (/livez, /readyz, /metrics).
EXPOSE 8443 8080
ENTRYPOINT ["/confighash"]
