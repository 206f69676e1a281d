# ferry-broker: a static binary on an empty base, run as the nonroot user.
# Build from the repository root:
#   docker build -f deploy/images/ferry-broker.Dockerfile -t ferry-broker:dev .
# Without a container daemon, `make image` writes the same image as an OCI
# archive (bin/images/ferry-broker.oci.tar).

FROM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG TARGETOS=linux
ARG TARGETARCH
RUN CGO_ENABLED=0 GOOS=$TARGETOS GOARCH=$TARGETARCH \
    go build -trimpath -ldflags "-s -w" -o /out/ferry-broker ./broker/cmd/ferry-broker
# What the empty base lacks: the nonroot user (65532), a writable /tmp, and
# CA roots for a kubeconfig or broker address that relies on public CAs.
RUN mkdir -p /rootfs/etc/ssl/certs /rootfs/tmp /rootfs/home/nonroot \
 && printf 'root:x:0:0:root:/root:/sbin/nologin\nnonroot:x:65532:65532:nonroot:/home/nonroot:/sbin/nologin\n' > /rootfs/etc/passwd \
 && printf 'root:x:0:\nnonroot:x:65532:\n' > /rootfs/etc/group \
 && cp /etc/ssl/certs/ca-certificates.crt /rootfs/etc/ssl/certs/ \
 && chmod 1777 /rootfs/tmp \
 && chmod 700 /rootfs/home/nonroot && chown 65532:65532 /rootfs/home/nonroot

FROM scratch
COPY --from=build /rootfs/ /
COPY --from=build /out/ferry-broker /ferry-broker
ENV PATH=/ HOME=/home/nonroot
USER 65532:65532
ENTRYPOINT ["/ferry-broker"]
