# syntax=docker/dockerfile:1
# iggy-connect for one feature set, built from source: a static binary on
# `scratch` (no shell, no libc) with CA certificates for rustls and a non-root
# user (uid 65532). The final stage is the same as Dockerfile.prebuilt's, which
# takes an already built static binary instead (what CI builds and runs).
#
#   docker build --build-arg FEATURES=postgres-source,stdout-sink -t iggy-connect:pg .
#   docker run --rm \
#     -v "$PWD/config:/etc/iggy-connect:ro" \
#     -v iggy-connect-state:/var/lib/iggy-connect/state \
#     iggy-connect:pg
#
# FEATURES is a comma-separated list of cargo features (connectors or bundles:
# default, all-sources, all-sinks, full). The config is read from
# IGGY_CONNECTORS_CONFIG_PATH; source state goes to the volume.
# Checked by scripts/check-dockerfile (run in .ci/run) without an engine; the
# final stage's layout is run for real by scripts/check-docker-image.
ARG FEATURES=default

FROM rust:1.95-bookworm AS build
ARG FEATURES
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
WORKDIR /src
# Cargo.toml names the tests and benches, so cargo needs them to read it.
COPY Cargo.toml Cargo.lock ./
COPY src ./src
COPY tests ./tests
COPY benches ./benches
# The static flag goes to the binary only (explicit --target), not to build
# scripts and proc macros. The state directory is created here so the volume
# starts out owned by the runtime user.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    target="$(rustc -vV | sed -n 's/^host: //p')" \
 && RUSTFLAGS="-C target-feature=+crt-static" cargo build --release --locked \
      --bin iggy-connect --target "${target}" \
      --no-default-features --features "${FEATURES}" \
 && mkdir -p /out/state \
 && cp "target/${target}/release/iggy-connect" /out/iggy-connect \
 && if readelf -lW /out/iggy-connect | grep -q INTERP; then \
      echo "iggy-connect is not statically linked" >&2; exit 1; \
    fi \
 && /out/iggy-connect list

FROM scratch
COPY docker/passwd docker/group /etc/
COPY --from=build /etc/ssl/certs/ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
COPY --from=build /out/iggy-connect /usr/local/bin/iggy-connect
COPY --from=build --chown=65532:65532 /out/state /var/lib/iggy-connect/state
ENV IGGY_CONNECTORS_CONFIG_PATH=/etc/iggy-connect/config.toml \
    IGGY_CONNECTORS_STATE_PATH=/var/lib/iggy-connect/state
VOLUME ["/var/lib/iggy-connect/state"]
# The API's port when the config sets [http] address = "0.0.0.0:8081" (the
# default, 127.0.0.1:8081, is not reachable from outside the container).
EXPOSE 8081
USER 65532:65532
ENTRYPOINT ["iggy-connect"]
CMD ["run"]
