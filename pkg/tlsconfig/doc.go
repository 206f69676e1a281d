// Package tlsconfig builds the mutually authenticated TLS 1.3 configurations
// of the edge ↔ broker connection and reads a peer's identity from its
// verified client certificate.
//
// Certificates, keys and CA bundles are re-read from disk when their files
// change, so rotating them needs no restart: the server checks on every
// handshake, the client on every dial (ClientConfig.Config; its certificate
// at every handshake). Each check is a stat of the files, not a poll. An
// enrolled edge holds its credentials in memory instead (NewMemoryClient),
// replaced on renewal (SetCredentials).
package tlsconfig
