package edgelease

import (
	"strings"

	"github.com/ferry-dev/ferry/pkg/naming"
)

// namePrefix starts every Lease name, so that ferry's Leases stand out
// among others in the namespace.
const namePrefix = "ferry-"

// identityHashLength is how many hex characters of the identity's hash a
// Lease name carries: enough to tell apart the identities one broker
// configures for one APIExport, short enough to read.
const identityHashLength = 10

// maxNameLength keeps Lease names valid DNS labels (and so valid DNS-1123
// subdomains) that fit a kubectl column.
const maxNameLength = 63

// Name is the Lease of the edge identity whose configured edge name is
// edgeName: "ferry-<edgeName>-<hash of identity>". Identities that share
// a name (an active edge and its standby serve one APIExport under one
// name) get a Lease each; the name is stable for as long as the
// configuration entry keeps its name and identity. edgeName is a DNS label
// (the broker's configuration validates it); it is cut when needed to keep
// the result within 63 characters.
func Name(edgeName, identity string) string {
	suffix := "-" + naming.Hash(identity)[:identityHashLength]
	name := strings.ToLower(edgeName)
	if room := maxNameLength - len(namePrefix) - len(suffix); len(name) > room {
		name = strings.TrimRight(name[:room], "-")
	}
	if name == "" {
		name = "edge"
	}
	return namePrefix + name + suffix
}
