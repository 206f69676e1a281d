// Package logging holds the structured log keys used across ferry, so that
// every component spells them the same way, and small logging adapters.
package logging

// Log keys, lowerCamel.
const (
	KeyIdentity        = "identity"
	KeyAgent           = "agent"
	KeyExport          = "apiExport"
	KeySession         = "session"
	KeyPeer            = "peer"
	KeyProtocolVersion = "protocolVersion"
	KeyAddress         = "address"
	KeyDelay           = "delay"
	KeyAttempt         = "attempt"
	KeyReason          = "reason"
	KeyHolder          = "holder"
	// KeyOwner is the address of the broker replica that owns an APIExport.
	KeyOwner          = "owner"
	KeyLogicalCluster = "logicalCluster"
	// KeyEndpoint is a virtual workspace endpoint's URL (one kcp shard's).
	KeyEndpoint = "endpoint"
	// KeyObject is an object's key (cluster|group/resource|namespace/name).
	KeyObject = "object"
	// KeyObjects is a count of objects.
	KeyObjects           = "objects"
	KeyPublishedResource = "publishedResource"
)
