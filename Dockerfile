# kvgate's image, for machines that reach a container registry: built from source in a
# Rust stage, run from a distroless one (glibc 2.36, libgcc, no shell, no package manager)
# as user 65532. Building on bookworm keeps the binary's glibc floor (2.34) at or below the
# runtime's.
#
# This repository's CI cannot build it (it reaches no registry for the base images):
# scripts/image.sh assembles the same runtime stage with no base image, and CI runs that
# one. Keep the two in step: user, paths, environment, ports, volume, entrypoint.
#
#   docker build -t kvgate .        (or: podman build -t kvgate .)
#   docker run -p 30000:30000 kvgate --control-plane-api-keys KEY --worker-urls http://engine:8000
ARG RUST_IMAGE=docker.io/library/rust:1-bookworm
ARG RUNTIME_IMAGE=gcr.io/distroless/cc-debian12:nonroot

FROM ${RUST_IMAGE} AS build
WORKDIR /src
COPY . .
# The caches speed up rebuilds under BuildKit or buildah; the binary is copied out of
# them in the same step. Debug line tables are stripped; symbols stay for backtraces.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p kvgate \
    && objcopy --strip-debug target/release/kvgate /kvgate \
    && install -d -m 0700 -o 65532 -g 65532 /data

FROM ${RUNTIME_IMAGE}
COPY --from=build /kvgate /usr/local/bin/kvgate
COPY --from=build --chown=65532:65532 /data /var/lib/kvgate
# A container listens on its own network namespace; a non-loopback host needs an admin
# key (--control-plane-api-keys or KVGATE_CONTROL_PLANE_API_KEYS) or kvgate refuses to start.
ENV KVGATE_HOST=0.0.0.0 \
    KVGATE_DATA_DIR=/var/lib/kvgate
USER 65532:65532
VOLUME ["/var/lib/kvgate"]
# 30000: the gateway; 29000: the keyless /metrics listener when --prometheus-port 29000.
EXPOSE 30000 29000
STOPSIGNAL SIGTERM
ENTRYPOINT ["/usr/local/bin/kvgate"]
