// Package tlsconfig builds the mutually authenticated TLS 1.3 configurations
// of the edge ↔ broker connection and reads a peer's identity from its
// verified client certificate.
//
// Certificates and keys are re-read from disk when their files change, so
// rotating them needs no restart: the server checks on every handshake, the
// client on every (re)connect. Both checks are a stat of the files, not a
// poll.
package tlsconfig
