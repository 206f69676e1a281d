// Package stream is the edge's side of the edge ↔ broker link: it dials the
// broker over mutually authenticated TLS, runs the handshake, keeps the
// stream alive with heartbeats and reconnects with exponential backoff and
// full jitter whenever the stream or the connection ends.
package stream

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"

	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
	"github.com/ferry-dev/ferry/pkg/backoff"
	"github.com/ferry-dev/ferry/pkg/link"
	"github.com/ferry-dev/ferry/pkg/logging"
	"github.com/ferry-dev/ferry/pkg/metrics"
	"github.com/ferry-dev/ferry/pkg/protocol"
	"github.com/ferry-dev/ferry/pkg/tlsconfig"
	"github.com/ferry-dev/ferry/pkg/version"
)

// Options configure a Client. All fields are required unless noted.
type Options struct {
	// BrokerAddress is host:port of the broker.
	BrokerAddress string
	// TLS is the client TLS configuration (tlsconfig.Client), read again
	// for every dial: a rotated CA bundle or certificate is used from the
	// next connection on.
	TLS *tlsconfig.ClientConfig
	// Dial opens the TCP connection to the broker (proxydial.Dialer.Dial:
	// directly or through an HTTP CONNECT proxy). Optional: a plain
	// net.Dialer when nil.
	Dial func(ctx context.Context, addr string) (net.Conn, error)
	// AgentName is sent in the hello; a DNS label.
	AgentName string
	// HeartbeatInterval is the edge's heartbeat proposal.
	HeartbeatInterval time.Duration
	// MaxMessageBytes is the largest message the edge accepts.
	MaxMessageBytes uint32
	// Backoff paces reconnects; Reset after every accepted handshake.
	Backoff *backoff.Exponential
	// StableAfter is how long a stream must last before a later failure
	// starts the backoff from the beginning again. Optional.
	StableAfter time.Duration
	// Handler holds the edge's state behind the stream.
	Handler Handler
	// Log receives the client's logs.
	Log logr.Logger
	// Metrics records connects and message sizes; nil records none.
	Metrics *metrics.Edge
	// Renewer renews the client certificate over the stream when the
	// broker offers it; nil (certificates from files) renews nothing and
	// does not offer the capability.
	Renewer Renewer
}

// Renewer renews the edge's certificate on a running stream
// (enrol.Renewer).
type Renewer interface {
	// Run renews until ctx ends (false) or a new certificate is installed
	// (true); send queues a message on the control lane.
	Run(ctx context.Context, send func(*ferryv1.ConnectRequest) error) bool
	// Deliver hands over the broker's answer; it must not block.
	Deliver(*ferryv1.IssuedCertificate)
}

// errRenewed ends a stream after a renewal: the edge reconnects at once
// with the new certificate, without a backoff delay.
var errRenewed = errors.New("client certificate renewed; reconnecting with it")

// Handler is the edge's state behind the stream: what to send and what to do
// with the broker's messages. Implementations must not block on the
// network.
type Handler interface {
	// Attach is called after each accepted handshake, before the loops
	// start; control is the stream's control lane (answers go there).
	Attach(hello *ferryv1.BrokerHello, control Sink)
	// Detach is called when an accepted stream has ended and its loops
	// have stopped.
	Detach()
	// Ready is signalled when Next may have messages.
	Ready() <-chan struct{}
	// Next returns the next bulk message to send, or false (called by the
	// sender goroutine only).
	Next() (*ferryv1.ConnectRequest, bool)
	// Handle processes a broker message other than heartbeats and hellos
	// (called by the dispatcher goroutine only); an error ends the stream.
	Handle(msg *ferryv1.ConnectResponse) error
	// TooLarge reports a message from Next that was not sent because it
	// exceeds the broker's limit.
	TooLarge(msg *ferryv1.ConnectRequest, size, limit int)
}

// Sink is the stream's control lane: it never blocks.
type Sink interface {
	Control(*ferryv1.ConnectRequest) error
}

// Stream queue sizes; see the broker's for the reasoning. The control
// queue holds the answers to every intent the broker's window allows.
const (
	receiveQueue    = 256
	controlCapacity = 8192
)

// Client keeps one stream to the broker open. Run it once.
type Client struct {
	opts Options
	// connected is true while an accepted stream runs (readiness).
	connected atomic.Bool
	// refusal is the broker's refusal of the last stream attempt, nil when
	// it was accepted or failed otherwise (readiness names it).
	refusal atomic.Pointer[error]
	// redirect is the address of the broker replica that owns this edge's
	// APIExport, as the replica last reached said (protocol.RedirectError):
	// the next attempt, only, dials it instead of BrokerAddress. Run's
	// goroutine only.
	redirect string
}

// Connected tells whether the broker accepted the current stream and it
// still runs.
func (c *Client) Connected() bool { return c.connected.Load() }

// Refusal is the broker's refusal of the last stream attempt (its handshake
// refused, or its stream ended with an error status an operator must act
// on, e.g. a revoked certificate), or nil.
func (c *Client) Refusal() error {
	if p := c.refusal.Load(); p != nil {
		return *p
	}
	return nil
}

func (c *Client) setRefusal(err error) {
	if err == nil {
		c.refusal.Store(nil)
		return
	}
	c.refusal.Store(&err)
}

// New returns a client.
func New(o Options) *Client { return &Client{opts: o} }

// Run connects and reconnects until ctx ends; it returns nil then.
func (c *Client) Run(ctx context.Context) error {
	log := c.opts.Log
	for attempt := 1; ; attempt++ {
		started := time.Now()
		redirected := c.redirect != ""
		accepted, err := c.session(ctx)
		c.redirect = ""
		if ctx.Err() != nil {
			return nil
		}
		if !accepted { // accepted ones are counted at acceptance
			c.opts.Metrics.StreamAttempt(attemptResult(err))
		}
		if refused(err) {
			c.setRefusal(err)
		} else {
			c.setRefusal(nil)
		}
		if accepted && time.Since(started) >= c.opts.StableAfter {
			c.opts.Backoff.Reset()
			attempt = 1
		}
		if owner, ok := protocol.RedirectOf(err); ok && !accepted && !redirected {
			// Another replica owns the export: there at once. Sent on
			// again from there (ownership moved meanwhile), the edge goes
			// back to its configured address after the backoff.
			log.Info("broker replica sent this edge to the replica that owns its APIExport; connecting there", logging.KeyOwner, owner)
			c.redirect = owner
			continue
		}
		if errors.Is(err, errRenewed) {
			// Planned: one reconnect per renewal, at once.
			log.Info("stream to broker ended; reconnecting", logging.KeyReason, err.Error())
			continue
		}
		delay := brokerDelay(c.opts.Backoff.Next(), err, c.opts.Backoff.Max)
		logStreamEnd(log, err, delay, attempt)
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(delay):
		}
	}
}

// brokerDelay is the reconnect delay after err: the backoff's, or longer
// when the broker refused the stream as busy with a retry delay
// (RESOURCE_EXHAUSTED with RetryInfo, a bounded handshake admission), which
// the edge waits at least, up to its own backoff cap: a busy broker spreads
// a reconnect storm out, but never keeps an edge away longer than the edge
// would wait anyway.
func brokerDelay(backoff time.Duration, err error, ceiling time.Duration) time.Duration {
	st, ok := status.FromError(err)
	if !ok || st.Code() != codes.ResourceExhausted {
		return backoff
	}
	for _, d := range st.Details() {
		if ri, ok := d.(*errdetails.RetryInfo); ok {
			return max(backoff, min(ri.GetRetryDelay().AsDuration(), ceiling))
		}
	}
	return backoff
}

// attemptResult is the result label of a stream attempt the broker did
// not accept.
func attemptResult(err error) string {
	if refused(err) {
		return "refused"
	}
	if _, ok := protocol.RedirectOf(err); ok {
		return "redirected"
	}
	return "failed"
}

// refused tells whether the broker refused the edge: an operator must act.
func refused(err error) bool {
	switch status.Code(err) {
	case codes.PermissionDenied, codes.Unauthenticated, codes.FailedPrecondition, codes.InvalidArgument:
		return true
	}
	return false
}

// logStreamEnd logs why a stream ended, loudly when an operator must act.
func logStreamEnd(log logr.Logger, err error, delay time.Duration, attempt int) {
	kv := []any{logging.KeyDelay, delay.Round(time.Millisecond).String(), logging.KeyAttempt, attempt}
	if refused(err) {
		// The broker's status message is its reason (e.g. what is revoked
		// and why); the error keeps the code.
		log.Error(err, "broker refused this edge; retrying", append(kv, logging.KeyReason, status.Convert(err).Message())...)
		return
	}
	log.Info("stream to broker ended; reconnecting", append(kv, logging.KeyReason, errorText(err))...)
}

// session dials, runs one stream to its end and reports whether the broker
// accepted the handshake. Each session has its own connection, so a
// reconnect re-reads rotated certificates and follows the backoff above
// rather than gRPC's internal one.
func (c *Client) session(ctx context.Context) (accepted bool, err error) {
	creds, err := c.opts.TLS.TransportCredentials()
	if err != nil {
		return false, err
	}
	dial := c.opts.Dial
	if dial == nil {
		var d net.Dialer
		dial = func(ctx context.Context, addr string) (net.Conn, error) { return d.DialContext(ctx, "tcp", addr) }
	}
	dialOpts := []grpc.DialOption{
		grpc.WithTransportCredentials(creds),
		// The dial function alone decides the route (and does its own name
		// resolution, or leaves it to the proxy): gRPC's own proxy support
		// and its resolver stay out of the way.
		grpc.WithContextDialer(dial),
		grpc.WithNoProxy(),
		grpc.WithKeepaliveParams(keepalive.ClientParameters{Time: 30 * time.Second, Timeout: 10 * time.Second, PermitWithoutStream: true}),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(int(c.opts.MaxMessageBytes))),
		grpc.WithStatsHandler(c.opts.Metrics.StatsHandler(ferryv1.SyncService_Connect_FullMethodName)),
	}
	addr := c.opts.BrokerAddress
	if c.redirect != "" {
		addr = c.redirect
		// The owner is verified as the broker this edge is configured
		// with (every replica serves the same certificate), not by the
		// address a replica named: a redirect cannot lead the edge to a
		// server that is not its broker.
		dialOpts = append(dialOpts, grpc.WithAuthority(c.opts.BrokerAddress))
	}
	conn, err := grpc.NewClient("passthrough:///"+addr, dialOpts...)
	if err != nil {
		return false, fmt.Errorf("invalid broker address %q: %w", addr, err)
	}
	defer conn.Close()

	streamCtx, cancelCause := context.WithCancelCause(ctx)
	cancel := func() { cancelCause(nil) }
	defer cancel()
	stream, err := ferryv1.NewSyncServiceClient(conn).Connect(streamCtx)
	if err != nil {
		return false, err
	}
	err = stream.Send(&ferryv1.ConnectRequest{Message: &ferryv1.ConnectRequest_Hello{Hello: &ferryv1.EdgeHello{
		ProtocolVersion:        protocol.Version,
		Capabilities:           c.capabilities(),
		AgentName:              c.opts.AgentName,
		MaxReceiveMessageBytes: c.opts.MaxMessageBytes,
		HeartbeatInterval:      durationpb.New(c.opts.HeartbeatInterval),
		EdgeVersion:            version.String(),
	}}})
	if err != nil {
		return false, streamError(stream, err)
	}
	r := link.Receive(streamCtx, stream.Recv, receiveQueue)
	hello, err := receiveHello(r)
	if err != nil {
		return false, err
	}
	if _, err := protocol.NegotiateVersion(hello.GetProtocolVersion()); err != nil {
		return false, fmt.Errorf("broker answered with an unusable protocol version: %w", err)
	}
	interval := max(hello.GetHeartbeatInterval().AsDuration(), protocol.MinHeartbeatInterval)
	export := hello.GetExport()
	c.opts.Log.Info("connected to broker",
		logging.KeyAddress, addr,
		logging.KeySession, hello.GetSessionId(),
		logging.KeyIdentity, hello.GetIdentity(),
		logging.KeyExport, export.GetExport().GetWorkspacePath()+"/"+export.GetExport().GetName(),
		logging.KeyLogicalCluster, export.GetLogicalCluster(),
		logging.KeyProtocolVersion, hello.GetProtocolVersion(),
		"virtualWorkspaceReady", export.GetVirtualWorkspaceReady(),
		"waitingFor", export.GetWaitingFor())

	loop := link.NewLoop[*ferryv1.ConnectResponse, *ferryv1.ConnectRequest](controlCapacity)
	c.opts.Handler.Attach(hello, loop)
	defer c.opts.Handler.Detach()
	c.connected.Store(true)
	c.setRefusal(nil)
	c.opts.Metrics.StreamAttempt("accepted")
	c.opts.Metrics.Connected(true)
	defer func() {
		c.connected.Store(false)
		c.opts.Metrics.Connected(false)
	}()
	maxSend := int(hello.GetMaxReceiveMessageBytes())
	loop.Receiver = r
	loop.Send = stream.Send
	loop.Handle = c.handle
	loop.Bulk = c.opts.Handler.Next
	loop.BulkReady = c.opts.Handler.Ready()
	loop.Heartbeat = func(hb *ferryv1.Heartbeat) *ferryv1.ConnectRequest {
		return &ferryv1.ConnectRequest{Message: &ferryv1.ConnectRequest_Heartbeat{Heartbeat: hb}}
	}
	loop.Interval, loop.DeadAfter = interval, protocol.DeadAfter(interval)
	loop.MaxSend, loop.Size = maxSend, func(m *ferryv1.ConnectRequest) int { return proto.Size(m) }
	loop.TooLarge = func(m *ferryv1.ConnectRequest, size int) { c.opts.Handler.TooLarge(m, size, maxSend) }
	renewing := make(chan struct{})
	if c.opts.Renewer != nil && slices.Contains(hello.GetCapabilities(), ferryv1.Capability_CAPABILITY_CERTIFICATE_RENEWAL) {
		go func() {
			defer close(renewing)
			if c.opts.Renewer.Run(streamCtx, loop.Control) {
				cancelCause(errRenewed)
			}
		}()
	} else {
		close(renewing)
	}
	err = loop.Run(streamCtx)
	if ctx.Err() == nil {
		cancel() // ends Recv; then the receiver reports why the stream ended
	}
	<-renewing
	if errors.Is(context.Cause(streamCtx), errRenewed) {
		_ = stream.CloseSend()
		return true, errRenewed
	}
	switch {
	case link.IsEOF(err):
		err = errors.New("broker closed the stream")
	case errors.Is(err, link.ErrPeerSilent):
		err = fmt.Errorf("no message from the broker for %s", protocol.DeadAfter(interval))
	default:
		err = sendFailed(r, err)
	}
	_ = stream.CloseSend()
	return true, err
}

func receiveHello(r link.Receiver[*ferryv1.ConnectResponse]) (*ferryv1.BrokerHello, error) {
	timeout := time.NewTimer(protocol.HandshakeTimeout)
	defer timeout.Stop()
	select {
	case msg := <-r.C:
		if h := msg.GetHello(); h != nil {
			return h, nil
		}
		return nil, fmt.Errorf("protocol error: the broker's first message is %T, not a BrokerHello", msg.GetMessage())
	case err := <-r.Err:
		return nil, err
	case <-timeout.C:
		return nil, fmt.Errorf("no BrokerHello within %s", protocol.HandshakeTimeout)
	}
}

// capabilities are this build's, less certificate renewal when the
// certificate comes from files (rotated on disk, not over the stream).
func (c *Client) capabilities() []ferryv1.Capability {
	caps := protocol.Capabilities()
	if c.opts.Renewer == nil {
		caps = slices.DeleteFunc(caps, func(x ferryv1.Capability) bool { return x == ferryv1.Capability_CAPABILITY_CERTIFICATE_RENEWAL })
	}
	return caps
}

// handle processes one broker message; the handler gets everything but
// liveness and handshake messages, and ends the stream on messages of
// features it does not implement, so the broker never believes they were
// applied.
func (c *Client) handle(msg *ferryv1.ConnectResponse) error {
	switch m := msg.GetMessage().(type) {
	case *ferryv1.ConnectResponse_Heartbeat:
		return nil
	case *ferryv1.ConnectResponse_ExportStatus:
		c.opts.Log.Info("APIExport status changed", logging.KeyLogicalCluster, m.ExportStatus.GetLogicalCluster(),
			"virtualWorkspaceReady", m.ExportStatus.GetVirtualWorkspaceReady(), "waitingFor", m.ExportStatus.GetWaitingFor())
		return c.opts.Handler.Handle(msg)
	case *ferryv1.ConnectResponse_Hello:
		return errors.New("protocol error: the broker sent a second BrokerHello")
	case *ferryv1.ConnectResponse_IssuedCertificate:
		if c.opts.Renewer == nil {
			return errors.New("protocol error: the broker sent an IssuedCertificate this edge did not ask for")
		}
		c.opts.Renewer.Deliver(m.IssuedCertificate)
		return nil
	case nil:
		return errors.New("protocol error: broker message without payload")
	default:
		return c.opts.Handler.Handle(msg)
	}
}

// streamError turns a failed Send into the stream's real status: gRPC
// reports io.EOF from Send when the server ended the stream, and the reason
// is only available from Recv. Only for a stream nobody else reads.
func streamError(stream ferryv1.SyncService_ConnectClient, err error) error {
	if errors.Is(err, io.EOF) {
		if _, rerr := stream.Recv(); rerr != nil {
			return rerr
		}
	}
	return err
}

// sendFailed is streamError for a stream whose Recv is owned by r.
func sendFailed(r link.Receiver[*ferryv1.ConnectResponse], err error) error {
	if !errors.Is(err, io.EOF) {
		return err
	}
	select {
	case rerr := <-r.Err:
		return rerr
	case <-time.After(protocol.HandshakeTimeout):
		return err
	}
}

func errorText(err error) string {
	if err == nil {
		return "stream ended"
	}
	return err.Error()
}
