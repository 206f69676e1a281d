package edgelease

import (
	"strconv"
	"time"
	"unicode/utf8"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/ferry-dev/ferry/broker/config"
)

// State is an edge's connection state as its Lease shows it.
type State string

// The states of an edge.
const (
	// Connected: the edge has a stream to this broker; the Lease's holder is
	// its agent name and its renewTime is the last message from it.
	Connected State = "Connected"
	// Disconnected: no stream; the holder is cleared.
	Disconnected State = "Disconnected"
)

// Labels and annotations of an edge's Lease. Annotation values are strings;
// times are RFC 3339 in UTC.
const (
	LabelManagedBy      = "app.kubernetes.io/managed-by"
	ManagedBy           = "ferry-broker"
	LabelEdge           = "ferry.dev/edge"
	AnnotationState     = "ferry.dev/state"
	AnnotationIdentity  = "ferry.dev/identity"
	AnnotationAPIExport = "ferry.dev/api-export"
	AnnotationAgentName = "ferry.dev/agent-name"
	// AnnotationEdgeVersion is the version the edge announced.
	AnnotationEdgeVersion     = "ferry.dev/edge-version"
	AnnotationProtocolVersion = "ferry.dev/protocol-version"
	AnnotationSessionID       = "ferry.dev/session-id"
	AnnotationPeerAddress     = "ferry.dev/peer-address"
	// AnnotationConnectedSince is set while Connected.
	AnnotationConnectedSince = "ferry.dev/connected-since"
	// AnnotationDisconnectedAt and AnnotationDisconnectReason are set while
	// Disconnected.
	AnnotationDisconnectedAt   = "ferry.dev/disconnected-at"
	AnnotationDisconnectReason = "ferry.dev/disconnect-reason"
	// AnnotationRefusedMessages counts the edge's messages the APIExport's
	// sync engine refused since it started (AdminService's
	// engine.refusedMessages).
	AnnotationRefusedMessages = "ferry.dev/refused-messages"
	// AnnotationNacks counts the intents the edge could not apply since the
	// broker started; AnnotationLastError is the last such failure.
	AnnotationNacks     = "ferry.dev/nacks"
	AnnotationLastError = "ferry.dev/last-error"
)

// Reasons the broker itself gives for a Disconnected edge.
const (
	// ReasonNotConnected: the broker started and the edge has not connected
	// to it (yet).
	ReasonNotConnected = "not connected since the broker started"
	// ReasonExpired: the Lease said Connected but was no longer renewed
	// (the broker holding the session stopped without ending it, e.g. it
	// was killed); found by a broker starting.
	ReasonExpired = "lease expired: the broker holding the session stopped renewing it"
)

// maxTextLength bounds the free-text annotations (reasons, errors): a Lease
// is a status display, not a log.
const maxTextLength = 256

// Status is what the Lease of one configured edge identity should show.
type Status struct {
	// Edge is the configuration entry: identity, name, APIExport (whose
	// workspace holds the Lease).
	Edge config.Edge
	// State is Connected or Disconnected.
	State State
	// Initial marks the state the broker asserts when it starts, before
	// any edge connected: it creates a missing Lease and ends a Connected
	// one whose holder stopped renewing (a broker that was killed), and
	// leaves any other Lease as it is, keeping its last reason.
	Initial bool

	// Session of a Connected edge, kept on Disconnected (the last session).
	AgentName       string
	EdgeVersion     string
	ProtocolVersion uint32
	SessionID       string
	PeerAddress     string
	ConnectedSince  time.Time
	// LastSeen is when the last message from the edge arrived (renewTime);
	// zero leaves renewTime as it is.
	LastSeen time.Time
	// LeaseDuration is how long after renewTime the Lease counts as expired
	// if it is not renewed; zero leaves it as it is.
	LeaseDuration time.Duration

	// DisconnectedAt and Reason describe the end of the last session.
	DisconnectedAt time.Time
	Reason         string

	// Counts are the error counts; nil leaves the Lease's as they are.
	Counts *Counts
}

// Counts are an edge's error counts.
type Counts struct {
	RefusedMessages uint64
	Nacks           uint64
	// LastError is the last apply error the edge reported; empty keeps the
	// previous one.
	LastError string
}

// key identifies the Lease of a status in the writer.
func (s Status) key() string { return s.Edge.Identity }

// name is the Lease's name.
func (s Status) name() string { return Name(s.Edge.ResolvedName(), s.Edge.Identity) }

// newLease is an empty Lease for s, to be filled by update.
func newLease(s Status, namespace string) *coordinationv1.Lease {
	return &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: s.name(), Namespace: namespace}}
}

// update makes l show s and tells whether it should be written: false
// means l belongs to another live session and is left alone. A Lease counts
// as held by another session while it says Connected with another session
// id and its renewTime plus leaseDurationSeconds has not passed (two
// brokers briefly side by side during a rollout, or a broker that has not
// noticed yet that its edge left): a Disconnected write then never hides
// the newer connection, and of two Connected writers the later session
// wins.
func update(l *coordinationv1.Lease, s Status, now time.Time) bool {
	cur, prevSession := l.Annotations[AnnotationState], l.Annotations[AnnotationSessionID]
	live := cur == string(Connected) && !expired(l, now)
	heldByOther := live && prevSession != s.SessionID
	switch {
	case s.Initial && (live || cur == string(Disconnected)):
		return false // a live session, or the last session's reason and counts
	case s.State == Connected && heldByOther && l.Spec.AcquireTime != nil && l.Spec.AcquireTime.After(s.ConnectedSince):
		return false
	case s.State == Disconnected && heldByOther:
		return false
	}

	if l.Labels == nil {
		l.Labels = map[string]string{}
	}
	l.Labels[LabelManagedBy] = ManagedBy
	l.Labels[LabelEdge] = s.Edge.ResolvedName()
	if l.Annotations == nil {
		l.Annotations = map[string]string{}
	}
	a := l.Annotations
	a[AnnotationIdentity] = s.Edge.Identity
	a[AnnotationAPIExport] = s.Edge.APIExport.String()
	a[AnnotationState] = string(s.State)
	setNonEmpty(a, AnnotationAgentName, s.AgentName)
	setNonEmpty(a, AnnotationEdgeVersion, s.EdgeVersion)
	if s.ProtocolVersion != 0 {
		a[AnnotationProtocolVersion] = strconv.FormatUint(uint64(s.ProtocolVersion), 10)
	}
	setNonEmpty(a, AnnotationSessionID, s.SessionID)
	setNonEmpty(a, AnnotationPeerAddress, s.PeerAddress)
	if c := s.Counts; c != nil {
		a[AnnotationRefusedMessages] = strconv.FormatUint(c.RefusedMessages, 10)
		a[AnnotationNacks] = strconv.FormatUint(c.Nacks, 10)
		setNonEmpty(a, AnnotationLastError, shorten(c.LastError))
	}
	if s.LeaseDuration > 0 {
		secs := int32((s.LeaseDuration + time.Second - 1) / time.Second)
		l.Spec.LeaseDurationSeconds = &secs
	}
	if !s.LastSeen.IsZero() {
		l.Spec.RenewTime = microTime(s.LastSeen)
	}

	switch s.State {
	case Connected:
		if prevSession != s.SessionID {
			// A new session: leaseTransitions counts the sessions after
			// the first, like a leader election's changes of hands.
			transitions := int32(0)
			if l.Spec.LeaseTransitions != nil {
				transitions = *l.Spec.LeaseTransitions + 1
			}
			l.Spec.LeaseTransitions = &transitions
		}
		holder := s.AgentName
		l.Spec.HolderIdentity = &holder
		if !s.ConnectedSince.IsZero() {
			l.Spec.AcquireTime = microTime(s.ConnectedSince)
			a[AnnotationConnectedSince] = rfc3339(s.ConnectedSince)
		}
		delete(a, AnnotationDisconnectedAt)
		delete(a, AnnotationDisconnectReason)
	case Disconnected:
		disconnectedAt, reason := s.DisconnectedAt, s.Reason
		if s.Initial && cur == string(Connected) {
			// Expired: its broker stopped without ending the session.
			disconnectedAt, reason = expiry(l), ReasonExpired
		}
		l.Spec.HolderIdentity = nil
		delete(a, AnnotationConnectedSince)
		if !disconnectedAt.IsZero() {
			a[AnnotationDisconnectedAt] = rfc3339(disconnectedAt)
		}
		setNonEmpty(a, AnnotationDisconnectReason, shorten(reason))
	}
	return true
}

// expired tells whether l's holder stopped renewing it: renewTime plus
// leaseDurationSeconds lies before now (a Lease without either counts as
// expired).
func expired(l *coordinationv1.Lease, now time.Time) bool { return expiry(l).Before(now) }

// expiry is when l expires unless renewed; zero without renewTime or
// leaseDurationSeconds.
func expiry(l *coordinationv1.Lease) time.Time {
	if l.Spec.RenewTime == nil || l.Spec.LeaseDurationSeconds == nil {
		return time.Time{}
	}
	return l.Spec.RenewTime.Add(time.Duration(*l.Spec.LeaseDurationSeconds) * time.Second)
}

func setNonEmpty(m map[string]string, k, v string) {
	if v != "" {
		m[k] = v
	}
}

func rfc3339(t time.Time) string { return t.UTC().Format(time.RFC3339) }

func microTime(t time.Time) *metav1.MicroTime {
	m := metav1.NewMicroTime(t)
	return &m
}

// shorten cuts s to maxTextLength bytes on a rune boundary, marking the cut.
func shorten(s string) string {
	if len(s) <= maxTextLength {
		return s
	}
	const ellipsis = "…"
	cut := maxTextLength - len(ellipsis)
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + ellipsis
}
