# Builds iggy-connect for a feature set as a static binary in a minimal image.
#   docker build --build-arg FEATURES=postgres-source,stdout-sink -t iggy-connect:pg .
ARG FEATURES=default

FROM rust:1.95-bookworm AS build
ARG FEATURES
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY src ./src
COPY benches ./benches
ENV RUSTFLAGS="-C target-feature=+crt-static"
RUN cargo build --release --locked --target x86_64-unknown-linux-gnu \
      --no-default-features --features "${FEATURES}" \
 && cp target/x86_64-unknown-linux-gnu/release/iggy-connect /iggy-connect

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /iggy-connect /usr/local/bin/iggy-connect
ENV IGGY_CONNECTORS_CONFIG_PATH=/etc/iggy-connect/config.toml \
    IGGY_CONNECTORS_STATE_PATH=/var/lib/iggy-connect/state
VOLUME ["/var/lib/iggy-connect/state"]
USER nonroot
ENTRYPOINT ["iggy-connect"]
CMD ["run"]
