package enrolment

// CheckBlocked returns a *BlockedError when b blocks the identity or the
// certificate (fingerprint, empty for an enrolment); a nil b blocks nothing.
func CheckBlocked(b Blocklist, identity, fingerprint string) error {
	if b == nil {
		return nil
	}
	if reason, blocked := b.Blocked(identity, fingerprint); blocked {
		return &BlockedError{Reason: reason}
	}
	return nil
}
