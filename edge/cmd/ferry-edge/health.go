package main

import (
	"errors"
	"fmt"
	"net/http"

	"google.golang.org/grpc/status"
)

// ready is the edge's readiness check. The leader is ready while its
// stream to the broker is established (accepted by the broker; a stream
// silent for three heartbeats is closed, so an established stream is one
// making progress). A standby replica is ready: it does what it should,
// wait for the Lease, and failing it would block a rolling update that
// keeps one replica leading.
func (p *edgeProcess) ready(*http.Request) error {
	cur := p.current.Load()
	if cur == nil {
		return errors.New("starting")
	}
	if !cur.leading.Load() {
		if p.cfg.LeaderElect {
			return nil // standby
		}
		return errors.New("starting")
	}
	if !cur.stream.Connected() {
		return streamDown(p.cfg.BrokerAddress, cur.stream.Refusal())
	}
	return nil
}

// streamDown is the readiness failure of an edge without a stream: the
// broker's reason when it refused the last attempt (a revoked certificate,
// an identity it does not know), so the probe says what to fix.
func streamDown(broker string, refusal error) error {
	if refusal != nil {
		st := status.Convert(refusal)
		return fmt.Errorf("the broker at %s refused this edge (%s): %s", broker, st.Code(), st.Message())
	}
	return fmt.Errorf("no established stream to the broker at %s (the log says why; see ferry_edge_stream_attempts_total)", broker)
}
