package related

import (
	"errors"
	"regexp"
)

// identityHashPattern is the shape of an APIExport's status.identityHash:
// kcp writes the hex SHA-256 of the export's identity key.
var identityHashPattern = regexp.MustCompile(`^[a-f0-9]{64}$`)

// checkIdentityHash repeats admission's rules for an entry's identityHash
// (an empty one is fine): a document that reached the edge without the
// CRD's validation must not make the broker claim a malformed identity.
func checkIdentityHash(group, hash string) error {
	switch {
	case hash == "":
		return nil
	case !identityHashPattern.MatchString(hash):
		return errors.New("identityHash: the other APIExport's status.identityHash is 64 lowercase hex characters")
	case group == "":
		return errors.New("identityHash: kinds of the core group have no identity; set group or drop identityHash")
	}
	return nil
}
