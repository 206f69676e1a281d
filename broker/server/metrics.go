package server

import (
	"github.com/ferry-dev/ferry/pkg/metrics"
)

// MetricsSource is what the broker's state gauges read at every scrape:
// every configured edge identity, its session and its export's engine.
func (s *Server) MetricsSource() metrics.BrokerSource {
	return func() []metrics.EdgeState {
		out := make([]metrics.EdgeState, 0, len(s.opts.Config.Edges))
		for _, e := range s.opts.Config.Edges {
			st := metrics.EdgeState{Identity: e.Identity, Export: e.APIExport.String()}
			if sess, ok := s.registry.ForExport(e.APIExport); ok && sess.Identity == e.Identity {
				st.Connected, st.ConnectedAt = true, sess.ConnectedAt
			}
			if eng, ok := s.engines.get(e.APIExport); ok {
				st.Engine = eng.MetricsState()
			}
			out = append(out, st)
		}
		return out
	}
}

// Handshake refusal reasons (ferry_broker_handshake_refusals_total).
const (
	refusedUnauthenticated  = "unauthenticated"
	refusedNotConfigured    = "identity_not_configured"
	refusedBadHello         = "invalid_hello"
	refusedProtocolVersion  = "protocol_version"
	refusedExportNotFound   = "export_not_found"
	refusedKCPUnavailable   = "kcp_unavailable"
	refusedExportHeld       = "export_served_by_another_edge"
	refusedShuttingDown     = "shutting_down"
	refusedHandshakeTimeout = "no_hello"
	// refusedNotOwner: another broker replica owns the edge's APIExport;
	// the edge was sent there.
	refusedNotOwner = "not_owner"
	// refusedRevoked: the certificate or the identity is blocked.
	refusedRevoked = "revoked"
	// refusedRevocationsUnknown: the blocks of the edge's workspace could
	// not be read from kcp.
	refusedRevocationsUnknown = "revocations_unavailable"
	// refusedBusy: too many handshakes in progress (AdmissionOptions);
	// the edge retries after the delay it was given.
	refusedBusy = "busy"
)
