# syntax=docker/dockerfile:1
# accel's container image: rdzv-server (the entrypoint), accel-agent and accel,
# statically linked (musl), on an empty base. Build from the repository root:
#   docker build -t accel/rdzv-server:0.1.0 .
# Where no Docker engine runs (or no base image can be pulled),
# scripts/build-image.sh builds the same image with buildah from binaries
# compiled on the host.
#
# Why static musl on scratch: the binaries need no libc at run time, so the
# image holds nothing but them (no shell, no package manager: nothing to patch),
# and accel-agent copied out of it runs in any training image, whatever its
# distribution or glibc version. musl resolves host names itself from
# /etc/hosts and /etc/resolv.conf (the container runtime provides both), without
# NSS. No TLS root store is needed: accel trusts only the CA files given by
# flags (--tls-client-ca, --etcd-ca, --rdzv-conf ca_file=...).

ARG RUST_VERSION=1.95.0
ARG DEBIAN_RELEASE=bookworm

FROM rust:${RUST_VERSION}-${DEBIAN_RELEASE} AS build
ARG TARGET=x86_64-unknown-linux-musl
# musl-tools: musl-gcc, for ring's C and assembly (no protoc: every .proto is
# compiled by protox, in Rust).
# Build-only packages in a throw-away stage: not pinned (DL3008), the base
# image pins the Debian release.
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends musl-tools \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
# The toolchain file first: rustup installs the pinned toolchain and the musl
# target in a layer that survives source changes.
COPY rust-toolchain.toml ./
RUN rustup target add "${TARGET}"
COPY . .
# The three binaries; worker-runtime (libtorch) is not built. The registry and
# target caches are BuildKit/buildah cache mounts, so the binaries are copied
# out of target/ inside the same step.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked --target "${TARGET}" \
        -p rendezvous-server -p accel-agent -p accel-cli \
 && mkdir -p /out/usr/local/bin /out/etc /out/tmp \
 && for b in rdzv-server accel-agent accel; do \
        install -m 0755 "target/${TARGET}/release/$b" /out/usr/local/bin/; \
    done \
 && chmod 1777 /out/tmp \
 && echo 'nonroot:x:65532:65532:nonroot:/nonexistent:/sbin/nologin' > /out/etc/passwd \
 && echo 'nonroot:x:65532:' > /out/etc/group

FROM scratch
ARG VERSION=0.1.0
ARG SOURCE_URL=""
ARG REVISION=""
LABEL org.opencontainers.image.title="accel rdzv-server" \
      org.opencontainers.image.description="accel's rendezvous server, with accel-agent and accel (static binaries)" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.licenses="Apache-2.0" \
      org.opencontainers.image.source="${SOURCE_URL}" \
      org.opencontainers.image.revision="${REVISION}"
COPY --from=build /out/ /
USER 65532:65532
# 29400: the rendezvous gRPC port (--bind); 29401: the metrics and health port.
EXPOSE 29400 29401
ENTRYPOINT ["/usr/local/bin/rdzv-server"]
