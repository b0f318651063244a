# gpu-share container image: the one gpu-share binary on distroless/cc (glibc, libgcc; no shell).
#   docker buildx build --platform linux/amd64,linux/arm64 \
#     --build-arg GIT_REVISION=$(git rev-parse --short=12 HEAD) -t REGISTRY/gpu-share:0.1.0 --push .
# Each architecture is cross-compiled on the build machine's own (--platform=$BUILDPLATFORM): no
# emulation. The image runs as UID/GID 65532 (distroless "nonroot"); the manifests expect that.

# ---- build ----------------------------------------------------------------------------------
# CI builds this file as written with buildah and runs the image (.ci/image; there the two base
# images are local stand-ins, since CI reaches no container registry).
FROM --platform=$BUILDPLATFORM rust:1-bookworm AS build
ARG TARGETARCH
WORKDIR /src

# The target's Rust triple, and for another architecture than the build machine's, its C cross
# compiler (ring compiles C and assembly) and Rust's standard library for it.
RUN case "${TARGETARCH:-$(dpkg --print-architecture)}" in \
      amd64) triple=x86_64-unknown-linux-gnu; cross="gcc-x86-64-linux-gnu libc6-dev-amd64-cross" ;; \
      arm64) triple=aarch64-unknown-linux-gnu; cross="gcc-aarch64-linux-gnu libc6-dev-arm64-cross" ;; \
      *) echo "gpu-share's image is built for amd64 and arm64, not $TARGETARCH" >&2; exit 1 ;; \
    esac \
 && echo "$triple" > /target \
 && if [ "$triple" != "$(rustc -vV | sed -n 's/^host: //p')" ]; then \
      apt-get update -qq && apt-get install -y -qq --no-install-recommends $cross >/dev/null \
      && rustup target add "$triple"; \
    fi
# The Cargo profile: release, as published (.ci/image builds the arm64 image it cannot run with
# the lighter cross-check, Cargo.toml).
ARG CARGO_PROFILE=release
ENV CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_LINKER=x86_64-linux-gnu-gcc \
    CC_x86_64_unknown_linux_gnu=x86_64-linux-gnu-gcc \
    CARGO_TARGET_AARCH64_UNKNOWN_LINUX_GNU_LINKER=aarch64-linux-gnu-gcc \
    CC_aarch64_unknown_linux_gnu=aarch64-linux-gnu-gcc

# Dependencies first, in their own layer: it is rebuilt only when Cargo.toml or Cargo.lock change.
# Stub sources stand in for every target the four manifests declare (the libraries of the pure
# core, the node agent and the simulator in crates/, the service's library and the gpu-share
# binary, each [[bench]] and each example's path under benches/), or cargo refuses them. The list is read from Cargo.toml itself, so a new
# benchmark needs no edit here. The benchmarks' and examples' stubs stay (only the binary is
# built).
COPY Cargo.toml Cargo.lock build.rs ./
COPY crates/core/Cargo.toml ./crates/core/
COPY crates/agent/Cargo.toml ./crates/agent/
COPY crates/simulator/Cargo.toml ./crates/simulator/
RUN mkdir src benches crates/core/src crates/agent/src crates/simulator/src \
 && echo 'fn main() {}' > src/main.rs \
 && touch src/lib.rs crates/core/src/lib.rs crates/agent/src/lib.rs crates/simulator/src/lib.rs \
 && for f in $(sed -n -e '/^\[\[bench\]\]/{n;s|^name = "\(.*\)"|benches/\1.rs|p}' \
                      -e 's|^path = "\(benches/.*\.rs\)"|\1|p' Cargo.toml); do \
      echo 'fn main() {}' > "$f"; \
    done \
 && cargo build --profile "$CARGO_PROFILE" --locked --target "$(cat /target)" --bin gpu-share \
 && rm -rf src crates/core/src crates/agent/src crates/simulator/src

# The four crates themselves. policies/default.yaml is embedded in the binary (include_str!).
# touch makes the real sources newer than the stub build, whatever mtimes COPY gave them, so cargo
# rebuilds them.
# The git revision comes as a build argument (.dockerignore keeps .git out):
#   docker build --build-arg GIT_REVISION=$(git rev-parse --short=12 HEAD) ...
# and `gpu-share --version` prints it.
COPY crates/core/src ./crates/core/src
COPY crates/agent/src ./crates/agent/src
COPY crates/simulator/src ./crates/simulator/src
COPY src ./src
COPY policies ./policies
ARG GIT_REVISION=unknown
ENV GPU_SHARE_GIT_REVISION=${GIT_REVISION}
RUN touch src/main.rs src/lib.rs crates/core/src/lib.rs crates/agent/src/lib.rs crates/simulator/src/lib.rs \
 && cargo build --profile "$CARGO_PROFILE" --locked --target "$(cat /target)" --bin gpu-share \
 && cp "target/$(cat /target)/$CARGO_PROFILE/gpu-share" /gpu-share \
 && if [ "$(cat /target)" = "$(rustc -vV | sed -n 's/^host: //p')" ]; then /gpu-share --version; fi

# ---- runtime --------------------------------------------------------------------------------
FROM gcr.io/distroless/cc-debian12:nonroot
LABEL org.opencontainers.image.title="gpu-share" \
      org.opencontainers.image.description="Kubernetes GPU sharing: mutating admission webhook and kube-scheduler extender" \
      org.opencontainers.image.source="https://github.com/gpu-share/gpu-share" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /gpu-share /usr/local/bin/gpu-share
USER 65532:65532
# 8443: HTTPS (/mutate, /scheduler/*); 8080: plain-HTTP admin (/livez, /readyz, /metrics).
EXPOSE 8443 8080
ENTRYPOINT ["/usr/local/bin/gpu-share"]
CMD ["serve"]
