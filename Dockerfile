# gpu-share container image: the one gpu-share binary on distroless/cc (glibc, libgcc; no shell).
#   docker build -t ghcr.io/gpu-share/gpu-share:0.1.0 .
# The image runs as UID/GID 65532 (distroless "nonroot"); the manifests in manifests/ expect that.

# ---- build ----------------------------------------------------------------------------------
FROM rust:1-bookworm AS build
WORKDIR /src

# Dependencies first, in their own layer: it is rebuilt only when Cargo.toml or Cargo.lock change.
# Stub sources stand in for the crate (a library plus the gpu-share binary).
COPY Cargo.toml Cargo.lock ./
RUN mkdir src \
 && echo 'fn main() {}' > src/main.rs \
 && touch src/lib.rs \
 && cargo build --release --locked \
 && rm -rf src

# The crate itself. policies/default.yaml is embedded in the binary (include_str!). touch makes the
# real sources newer than the stub build, whatever mtimes COPY gave them, so cargo rebuilds them.
COPY src ./src
COPY policies ./policies
RUN touch src/main.rs src/lib.rs \
 && cargo build --release --locked \
 && install -m 0755 target/release/gpu-share /usr/local/bin/gpu-share

# ---- runtime --------------------------------------------------------------------------------
FROM gcr.io/distroless/cc-debian12:nonroot
LABEL org.opencontainers.image.title="gpu-share" \
      org.opencontainers.image.description="Kubernetes GPU sharing: mutating admission webhook and kube-scheduler extender" \
      org.opencontainers.image.source="https://github.com/gpu-share/gpu-share" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /usr/local/bin/gpu-share /usr/local/bin/gpu-share
USER 65532:65532
# 8443: HTTPS (/mutate, /scheduler/*); 8080: plain-HTTP admin (/livez, /readyz, /metrics).
EXPOSE 8443 8080
ENTRYPOINT ["/usr/local/bin/gpu-share"]
CMD ["serve"]
