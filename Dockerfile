# syntax=docker/dockerfile:1
# Multi-stage build: compile in the Rust image, ship the binary alone on a slim Debian.
FROM rust:1.89-slim-bookworm AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY agent ./agent
COPY tests ./tests
RUN cargo build --release --locked -p vigil && strip target/release/vigil

FROM debian:bookworm-slim
LABEL org.opencontainers.image.title="vigil" \
      org.opencontainers.image.description="Node-local agent that restarts hung accelerator workers safely" \
      org.opencontainers.image.licenses="Apache-2.0"
RUN apt-get update && apt-get install -y --no-install-recommends ca-certificates \
    && rm -rf /var/lib/apt/lists/*
COPY --from=build /src/target/release/vigil /usr/local/bin/vigil
# NB: the agent talks to the Docker socket, which is root-equivalent on the node. Run as a user
# in the socket's group (often 999 or 998, see `stat -c %g /var/run/docker.sock`), set with
# the DaemonSet's securityContext.runAsGroup / supplementalGroups.
# The NVIDIA container toolkit mounts libnvidia-ml.so into containers that ask for it; the agent
# needs only the management library (NVML), no CUDA, and no GPU of its own.
ENV NVIDIA_VISIBLE_DEVICES=all \
    NVIDIA_DRIVER_CAPABILITIES=utility
USER 65532:65532
EXPOSE 9464
ENTRYPOINT ["/usr/local/bin/vigil"]
CMD ["run"]
