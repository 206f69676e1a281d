package engine

import (
	"strings"
	"sync"

	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
)

// ErrorCounts are the edge's errors the engine saw since it started, as the
// edge's Lease in kcp shows them.
type ErrorCounts struct {
	// Refused edge messages (see Manager.Refused).
	Refused uint64
	// Nacks are intents the edge answered with an error (stale answers,
	// already answered or of another stream, do not count).
	Nacks uint64
	// LastError is the last nack, "REASON: message".
	LastError string
}

// nackCounter counts the edge's nacks. Safe for concurrent use.
type nackCounter struct {
	mu        sync.Mutex
	nacks     uint64
	lastError string
}

func (c *nackCounter) add(ae *ferryv1.ApplyError) {
	text := strings.TrimPrefix(ae.GetReason().String(), "APPLY_ERROR_REASON_") + ": " + ae.GetMessage()
	c.mu.Lock()
	defer c.mu.Unlock()
	c.nacks++
	c.lastError = text
}

// ErrorCounts returns the engine's error counts.
func (e *Engine) ErrorCounts() ErrorCounts {
	e.nacks.mu.Lock()
	defer e.nacks.mu.Unlock()
	return ErrorCounts{Refused: e.mgr.Refused(), Nacks: e.nacks.nacks, LastError: e.nacks.lastError}
}
