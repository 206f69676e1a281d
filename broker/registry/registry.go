// Package registry tracks the broker's connected edges. It keeps the
// invariant that at most one edge serves an APIExport at a time, and it is
// the source of the admin API's edge list.
package registry

import (
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
	"github.com/ferry-dev/ferry/broker/config"
	"github.com/ferry-dev/ferry/broker/kcp"
)

// Info describes an accepted edge stream; it does not change while the
// stream lives.
type Info struct {
	ID          string
	Identity    string
	AgentName   string
	EdgeVersion string
	Export      config.APIExportRef
	ExportState kcp.ExportState
	PeerAddress string
	// CertificateSHA256 is the fingerprint of the client certificate the
	// stream was authenticated with (tlsconfig.Fingerprint): a revoked
	// certificate ends exactly its streams.
	CertificateSHA256 string
	ProtocolVersion   uint32
	// EdgeMaxMessageBytes is the largest message the edge accepts.
	EdgeMaxMessageBytes uint32
	// Capabilities both sides support on this stream.
	Capabilities []ferryv1.Capability
	ConnectedAt  time.Time
}

// Session is one accepted edge stream.
type Session struct {
	Info

	// mu guards the mutable part of the export state.
	mu                   sync.Mutex
	virtualWorkspaceURLs []string

	// lastSeen is the time of the last message from the edge, in Unix nanoseconds.
	lastSeen atomic.Int64
	// end ends the session's stream with a cause (broker shutdown, a
	// revocation).
	end func(cause error)
}

// NewSession returns a session; end must end its stream, and the stream's
// handler must tell the edge the cause (ErrClosed, or a gRPC status).
func NewSession(info Info, end func(cause error)) *Session {
	out := &Session{Info: info, end: end, virtualWorkspaceURLs: info.ExportState.VirtualWorkspaceURLs}
	out.lastSeen.Store(info.ConnectedAt.UnixNano())
	return out
}

// SetVirtualWorkspaceURLs records the export's current virtual workspace
// URLs.
func (s *Session) SetVirtualWorkspaceURLs(urls []string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.virtualWorkspaceURLs = urls
}

// ExportState is the export's state as last seen: resolved at the handshake,
// the virtual workspace URLs kept current by a watch.
func (s *Session) ExportState() kcp.ExportState {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.Info.ExportState
	st.VirtualWorkspaceURLs = s.virtualWorkspaceURLs
	return st
}

// Seen records that a message from the edge arrived. Safe for concurrent use.
func (s *Session) Seen(t time.Time) { s.lastSeen.Store(t.UnixNano()) }

// LastSeen is when the last message from the edge arrived.
func (s *Session) LastSeen() time.Time { return time.Unix(0, s.lastSeen.Load()) }

// HeldError is returned by Acquire when another edge serves the APIExport.
type HeldError struct {
	Export config.APIExportRef
	Holder *Session
}

func (e *HeldError) Error() string {
	h := e.Holder
	return fmt.Sprintf("APIExport %s is already served by edge %q (agent %q, session %s, connected since %s from %s); "+
		"only one edge may serve an APIExport at a time, retry after it disconnects",
		e.Export, h.Identity, h.AgentName, h.ID, h.ConnectedAt.UTC().Format(time.RFC3339), h.PeerAddress)
}

// Registry holds the active sessions. Safe for concurrent use.
type Registry struct {
	mu       sync.Mutex
	byExport map[config.APIExportRef]*Session
	closed   bool
}

// NewRegistry returns an empty registry.
func NewRegistry() *Registry {
	return &Registry{byExport: map[config.APIExportRef]*Session{}}
}

// Acquire registers s as the edge serving s.Export. It fails with *HeldError
// when another session holds the export, or when the registry is closed. The
// returned release must be called when the stream ends; it is idempotent.
func (r *Registry) Acquire(s *Session) (release func(), err error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return nil, ErrClosed
	}
	if h, ok := r.byExport[s.Export]; ok {
		return nil, &HeldError{Export: s.Export, Holder: h}
	}
	r.byExport[s.Export] = s
	var once sync.Once
	return func() {
		once.Do(func() {
			r.mu.Lock()
			defer r.mu.Unlock()
			if r.byExport[s.Export] == s {
				delete(r.byExport, s.Export)
			}
		})
	}, nil
}

// ErrClosed is returned by Acquire once the broker is shutting down.
var ErrClosed = errors.New("the broker is shutting down")

// ForExport returns the session serving export, if any.
func (r *Registry) ForExport(export config.APIExportRef) (*Session, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	s, ok := r.byExport[export]
	return s, ok
}

// Close refuses new sessions and ends every active stream.
func (r *Registry) Close() {
	r.mu.Lock()
	r.closed = true
	sessions := make([]*Session, 0, len(r.byExport))
	for _, s := range r.byExport {
		sessions = append(sessions, s)
	}
	r.mu.Unlock()
	for _, s := range sessions {
		s.end(ErrClosed)
	}
}

// End ends every active stream whose session matches, with cause, and
// returns how many. The sessions leave the registry when their streams'
// handlers return.
func (r *Registry) End(match func(*Session) bool, cause error) int {
	r.mu.Lock()
	var sessions []*Session
	for _, s := range r.byExport {
		if match(s) {
			sessions = append(sessions, s)
		}
	}
	r.mu.Unlock()
	for _, s := range sessions {
		s.end(cause)
	}
	return len(sessions)
}
