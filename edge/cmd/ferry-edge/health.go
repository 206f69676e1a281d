package main

import (
	"errors"
	"fmt"
	"net/http"
	"time"

	"google.golang.org/grpc/status"

	"github.com/ferry-dev/ferry/pkg/cli"
)

// ready is the edge's readiness check. The leader is ready while its
// stream to the broker is established (accepted by the broker; a stream
// silent for three heartbeats is closed, so an established stream is one
// making progress). A standby replica is ready: it does what it should,
// wait for the Lease, and failing it would block a rolling update that
// keeps one replica leading.
func (p *edgeProcess) ready(*http.Request) error {
	if p.tls.Load() == nil {
		return errors.New("enrolling (no client certificate yet)")
	}
	if notAfter, err := p.clientCertificateExpiry(); err == nil && time.Now().After(notAfter) {
		return fmt.Errorf("the client certificate expired at %s", notAfter.UTC().Format(time.RFC3339))
	}
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
	if p.renewer != nil {
		if err := p.renewer.Err(); err != nil {
			return &cli.Degraded{Reason: "certificate renewal failing: " + err.Error()}
		}
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
