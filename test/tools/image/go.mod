// mkimage writes ferry's container images as OCI archives without a
// container daemon (make image). A module of its own so that the main
// module's dependencies stay those of ferry's binaries.
module github.com/ferry-dev/ferry/test/tools/image

go 1.26

require github.com/google/go-containerregistry v0.22.1

require (
	github.com/klauspost/compress v1.19.2 // indirect
	github.com/opencontainers/go-digest v1.0.0 // indirect
	github.com/opencontainers/image-spec v1.1.1 // indirect
	golang.org/x/sync v0.22.0 // indirect
)
