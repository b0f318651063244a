# gpu-share container image: the one gpu-share binary on distroless/cc (glibc, libgcc; no shell).
#   docker build --build-arg GIT_REVISION=$(git rev-parse --short=12 HEAD) \
#     -t ghcr.io/gpu-share/gpu-share:0.1.0 .
# The image runs as UID/GID 65532 (distroless "nonroot"); the manifests in manifests/ expect that.

# ---- build ----------------------------------------------------------------------------------
# CI builds this file as written with buildah and runs the image (.ci/image; there the two base
# images are local stand-ins, since CI reaches no container registry).
FROM rust:1-bookworm AS build
WORKDIR /src

# Dependencies first, in their own layer: it is rebuilt only when Cargo.toml or Cargo.lock change.
# Stub sources stand in for every target Cargo.toml declares (the library, the gpu-share binary,
# the benchmark and the examples), or cargo refuses the manifest; the benchmark's and examples'
# stubs stay (only the binary is built).
COPY Cargo.toml Cargo.lock build.rs ./
RUN mkdir src benches \
 && echo 'fn main() {}' > src/main.rs \
 && touch src/lib.rs \
 && for f in decision load floor; do echo 'fn main() {}' > benches/$f.rs; done \
 && cargo build --release --locked --bin gpu-share \
 && rm -rf src

# The crate itself. policies/default.yaml is embedded in the binary (include_str!). touch makes the
# real sources newer than the stub build, whatever mtimes COPY gave them, so cargo rebuilds them.
# The git revision comes as a build argument (.dockerignore keeps .git out):
#   docker build --build-arg GIT_REVISION=$(git rev-parse --short=12 HEAD) ...
# and `gpu-share --version` prints it.
COPY src ./src
COPY policies ./policies
ARG GIT_REVISION=unknown
ENV GPU_SHARE_GIT_REVISION=${GIT_REVISION}
RUN touch src/main.rs src/lib.rs \
 && cargo build --release --locked --bin gpu-share \
 && ./target/release/gpu-share --version

# ---- runtime --------------------------------------------------------------------------------
FROM gcr.io/distroless/cc-debian12:nonroot
LABEL org.opencontainers.image.title="gpu-share" \
      org.opencontainers.image.description="Kubernetes GPU sharing: mutating admission webhook and kube-scheduler extender" \
      org.opencontainers.image.source="https://github.com/gpu-share/gpu-share" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /src/target/release/gpu-share /usr/local/bin/gpu-share
USER 65532:65532
# 8443: HTTPS (/mutate, /scheduler/*); 8080: plain-HTTP admin (/livez, /readyz, /metrics).
EXPOSE 8443 8080
ENTRYPOINT ["/usr/local/bin/gpu-share"]
CMD ["serve"]
