# The kubefill image for those who have Docker: the same binary, built with
# the same flags, the same entrypoint and the same non-root user (107, CDI's
# worker uid) as the image `make images` builds without Docker
# (hack/images.sh), here on Debian's slim base with its qemu-utils.
#
#   docker build --build-arg VERSION="$(git describe --tags --always --dirty)" -t kubefill/kubefill:dev .

FROM golang:1.26-bookworm AS build
WORKDIR /src
# Modules first, so that a source change reuses the download layer; the API
# module is a replace target, so it comes with them.
COPY go.mod go.sum ./
COPY staging/ staging/
RUN go mod download
COPY . .
ARG VERSION=v0.0.0-dev
RUN CGO_ENABLED=0 GOTOOLCHAIN=local go build -trimpath -ldflags "-X main.version=${VERSION}" \
      -o /out/kubefill ./cmd/kubefill

FROM debian:bookworm-slim
# qemu-img converts disk formats; prlimit (util-linux, already in the base)
# bounds it; the CA bundle verifies HTTPS and registry sources.
RUN apt-get update \
 && apt-get install -y --no-install-recommends qemu-utils ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd -g 107 kubefill && useradd -u 107 -g 107 -m -d /home/kubefill -s /usr/sbin/nologin kubefill \
 && groupadd -g 65532 nonroot && useradd -u 65532 -g 65532 -m -d /home/nonroot -s /usr/sbin/nologin nonroot
COPY --from=build /out/kubefill /usr/bin/kubefill
USER 107:107
WORKDIR /
ENTRYPOINT ["/usr/bin/kubefill"]
