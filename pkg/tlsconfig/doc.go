// Package tlsconfig builds the mutually authenticated TLS configurations of
// the edge ↔ broker connection (TLS 1.3 only unless a Profile allows TLS
// 1.2 with chosen suites) and reads a peer's identity from its verified
// client certificate. A handshake that fails because the two profiles do
// not meet is explained on both sides: the broker logs what the edge
// offered against what it allows, the edge's error names its own profile.
//
// Certificates, keys and CA bundles are re-read from disk when their files
// change, so rotating them needs no restart: the server checks on every
// handshake, the client on every dial (ClientConfig.Config; its certificate
// at every handshake). Each check is a stat of the files, not a poll. An
// enrolled edge holds its credentials in memory instead (NewMemoryClient),
// replaced on renewal (SetCredentials).
package tlsconfig
