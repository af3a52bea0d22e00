# syntax=docker/dockerfile:1
# Multi-stage build: compile in the Rust image, ship the binary alone on a distroless base.
# Needs BuildKit (the default builder since Docker 23) for the cache mounts.
FROM rust:1.89-slim-bookworm AS build
# protoc compiles the Kubernetes CRI protos (crate k8s-cri) at build time.
RUN apt-get update -qq && apt-get install -y -qq --no-install-recommends protobuf-compiler \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
# Only what the build reads; .dockerignore keeps the rest (target/, .git, tests/, docs/...) out
# of the context. NB: agent/Cargo.toml declares [[test]] and [[example]] targets with paths in
# ../tests/, which is not copied: cargo does not check that an explicitly given target path
# exists when it loads the manifest, only when it compiles that target, and
# `--bin vigil` compiles the library and this binary alone.
COPY Cargo.toml Cargo.lock ./
COPY agent ./agent
# The registry, git checkouts and target/ are cache mounts, so a source change rebuilds only
# the crate. A cache mount is not part of the image, so the binary is copied out of it. The
# workspace's [profile.release] strips it (strip = true): no strip step here.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/usr/local/cargo/git \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p vigil --bin vigil \
    && cp target/release/vigil /usr/local/bin/vigil

# Distroless "cc": glibc, libgcc and CA certificates, no shell and no package manager (so no
# RUN line can follow). glibc because NVML is loaded with dlopen at run time, which a static
# musl binary cannot do. The :nonroot tag's user is 65532, set again below to be explicit.
FROM gcr.io/distroless/cc-debian12:nonroot
LABEL org.opencontainers.image.title="vigil" \
      org.opencontainers.image.description="Node-local agent that restarts hung accelerator workers safely" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /usr/local/bin/vigil /usr/local/bin/vigil
# NB: the agent talks to the container runtime's socket, which is root-equivalent on the node.
# Docker's: run as a user in the socket's group (often 999 or 998, see `stat -c %g
# /var/run/docker.sock`), set with the DaemonSet's supplementalGroups (deploy/overlays/docker).
# containerd's on GKE is root's alone: deploy/overlays/gke runs the agent as root.
# The NVIDIA container toolkit mounts libnvidia-ml.so into containers that ask for it; the agent
# needs only the management library (NVML), no CUDA, and no GPU of its own.
ENV NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=utility
USER 65532:65532
EXPOSE 9464
ENTRYPOINT ["/usr/local/bin/vigil"]
CMD ["run"]
