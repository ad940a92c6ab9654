# syntax=docker/dockerfile:1
#
# Herald's three images from one Dockerfile:
#
#   docker build --target operator   -t ghcr.io/herald-dev/herald-operator:0.1.0 .
#   docker build --target dispatcher -t ghcr.io/herald-dev/herald-dispatcher:0.1.0 .
#   docker build --target api        -t ghcr.io/herald-dev/herald-api:0.1.0 .
#
# The same images are built without Docker by `make image` (scripts/image.sh):
# the binaries, exactly the libraries they link (glibc, libgcc_s: what distroless `cc`
# holds), passwd/group with "nonroot" 65532, nsswitch.conf and the CA bundle,
# assembled reproducibly. That is what the project's tests build and run
# (e2e/tests/image.rs), and they fail when its USER, EXPOSE, ENTRYPOINT or CMD differ
# from the stages below: change both together. This file is kept for people with
# Docker and deliberately plain. The runtime is distroless `cc` (glibc, CA
# certificates, tzdata, no shell, uid/gid 65532 "nonroot"), ~25 MB: the binaries link
# nothing but glibc (TLS is rustls with ring; the roots come from the CA bundle). A
# fully static musl build would save a few MB but musl's allocator costs throughput
# under the dispatcher's load.

FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
# Cache mounts keep the registry and target directory between builds (BuildKit).
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked -p herald-operator -p herald-dispatcher -p herald-api \
 && mkdir -p /out \
 && cp target/release/herald-operator target/release/herald-dispatcher target/release/herald-api /out/

FROM gcr.io/distroless/cc-debian12:nonroot AS operator
COPY --from=build /out/herald-operator /usr/local/bin/herald-operator
USER 65532:65532
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/herald-operator"]
CMD ["run"]

FROM gcr.io/distroless/cc-debian12:nonroot AS dispatcher
COPY --from=build /out/herald-dispatcher /usr/local/bin/herald-dispatcher
USER 65532:65532
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/herald-dispatcher"]

FROM gcr.io/distroless/cc-debian12:nonroot AS api
COPY --from=build /out/herald-api /usr/local/bin/herald-api
USER 65532:65532
EXPOSE 8080
ENTRYPOINT ["/usr/local/bin/herald-api"]
