package edgelease

import (
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	coordinationv1 "k8s.io/api/coordination/v1"

	"github.com/ferry-dev/ferry/broker/config"
)

var (
	t0       = time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	testEdge = config.Edge{
		Identity:  "spiffe://example.com/edge/databases-eu",
		Name:      "databases",
		APIExport: config.APIExportRef{Workspace: "root:org", Name: "databases.example.com"},
	}
)

func connected(session string, since, seen time.Time) Status {
	return Status{
		Edge: testEdge, State: Connected, AgentName: "eu-1", EdgeVersion: "v1.2.3", ProtocolVersion: 1,
		SessionID: session, PeerAddress: "10.0.0.7:51234", ConnectedSince: since, LastSeen: seen,
		LeaseDuration: 30 * time.Second, Counts: &Counts{RefusedMessages: 2, Nacks: 5, LastError: "INVALID: bad field"},
	}
}

func disconnected(session string, at time.Time, reason string) Status {
	s := connected(session, time.Time{}, at)
	s.State, s.DisconnectedAt, s.Reason = Disconnected, at, reason
	s.Counts = &Counts{RefusedMessages: 3, Nacks: 6}
	return s
}

// leaseAfter applies statuses one after the other to a new Lease, each at
// the time of its LastSeen (or t0).
func leaseAfter(statuses ...Status) *coordinationv1.Lease {
	l := newLease(statuses[0], "default")
	for _, s := range statuses {
		now := s.LastSeen
		if now.IsZero() {
			now = t0
		}
		update(l, s, now)
	}
	return l
}

func TestUpdate(t *testing.T) {
	initial := Status{Edge: testEdge, State: Disconnected, Initial: true, Reason: ReasonNotConnected}
	tests := []struct {
		name      string
		lease     *coordinationv1.Lease // nil: a new Lease
		status    Status
		now       time.Time
		wantWrite bool
		// check inspects the result when wantWrite.
		check func(t *testing.T, l *coordinationv1.Lease)
	}{
		{
			name: "connected on a new Lease", status: connected("s1", t0, t0.Add(time.Second)), now: t0.Add(time.Second), wantWrite: true,
			check: func(t *testing.T, l *coordinationv1.Lease) {
				wantSpec(t, l, stringPtr("eu-1"), t0, t0.Add(time.Second), 30, 0)
				wantAnnotations(t, l, map[string]string{
					AnnotationState: "Connected", AnnotationIdentity: testEdge.Identity, AnnotationAPIExport: "root:org/databases.example.com",
					AnnotationAgentName: "eu-1", AnnotationEdgeVersion: "v1.2.3", AnnotationProtocolVersion: "1", AnnotationSessionID: "s1",
					AnnotationPeerAddress: "10.0.0.7:51234", AnnotationConnectedSince: "2026-03-01T12:00:00Z",
					AnnotationRefusedMessages: "2", AnnotationNacks: "5", AnnotationLastError: "INVALID: bad field",
				})
				if l.Labels[LabelManagedBy] != "ferry-broker" || l.Labels[LabelEdge] != "databases" {
					t.Errorf("labels = %v", l.Labels)
				}
			},
		},
		{
			name: "renewal of the same session moves renewTime only", lease: leaseAfter(connected("s1", t0, t0)),
			status: connected("s1", t0, t0.Add(10*time.Second)), now: t0.Add(10 * time.Second), wantWrite: true,
			check: func(t *testing.T, l *coordinationv1.Lease) {
				wantSpec(t, l, stringPtr("eu-1"), t0, t0.Add(10*time.Second), 30, 0)
			},
		},
		{
			name: "disconnected clears the holder and keeps version and counts", lease: leaseAfter(connected("s1", t0, t0)),
			status: disconnected("s1", t0.Add(5*time.Second), "edge closed the stream"), now: t0.Add(5 * time.Second), wantWrite: true,
			check: func(t *testing.T, l *coordinationv1.Lease) {
				if l.Spec.HolderIdentity != nil {
					t.Errorf("holderIdentity = %q, want cleared", *l.Spec.HolderIdentity)
				}
				wantAnnotations(t, l, map[string]string{
					AnnotationState: "Disconnected", AnnotationDisconnectedAt: "2026-03-01T12:00:05Z", AnnotationDisconnectReason: "edge closed the stream",
					AnnotationEdgeVersion: "v1.2.3", AnnotationAgentName: "eu-1", AnnotationRefusedMessages: "3", AnnotationNacks: "6",
					AnnotationLastError: "INVALID: bad field", AnnotationConnectedSince: "",
				})
			},
		},
		{
			name:   "a new session counts a transition and drops the last reason",
			lease:  leaseAfter(connected("s1", t0, t0), disconnected("s1", t0.Add(time.Second), "gone")),
			status: connected("s2", t0.Add(time.Minute), t0.Add(time.Minute)), now: t0.Add(time.Minute), wantWrite: true,
			check: func(t *testing.T, l *coordinationv1.Lease) {
				wantSpec(t, l, stringPtr("eu-1"), t0.Add(time.Minute), t0.Add(time.Minute), 30, 1)
				wantAnnotations(t, l, map[string]string{AnnotationState: "Connected", AnnotationSessionID: "s2", AnnotationDisconnectedAt: "", AnnotationDisconnectReason: ""})
			},
		},
		{
			name: "disconnect of an old session leaves a newer live one alone", lease: leaseAfter(connected("s2", t0, t0)),
			status: disconnected("s1", t0.Add(time.Second), "gone"), now: t0.Add(time.Second), wantWrite: false,
		},
		{
			name: "disconnect of an old session ends an expired one", lease: leaseAfter(connected("s2", t0, t0)),
			status: disconnected("s1", t0.Add(time.Minute), "gone"), now: t0.Add(time.Minute), wantWrite: true,
			check: func(t *testing.T, l *coordinationv1.Lease) {
				wantAnnotations(t, l, map[string]string{AnnotationState: "Disconnected", AnnotationSessionID: "s1"})
			},
		},
		{
			name: "an older session does not take the Lease from a newer live one", lease: leaseAfter(connected("s2", t0.Add(time.Second), t0.Add(time.Second))),
			status: connected("s1", t0, t0.Add(2*time.Second)), now: t0.Add(2 * time.Second), wantWrite: false,
		},
		{
			name: "a newer session takes the Lease from an older live one", lease: leaseAfter(connected("s1", t0, t0)),
			status: connected("s2", t0.Add(time.Second), t0.Add(time.Second)), now: t0.Add(time.Second), wantWrite: true,
			check: func(t *testing.T, l *coordinationv1.Lease) {
				wantAnnotations(t, l, map[string]string{AnnotationSessionID: "s2"})
				wantSpec(t, l, stringPtr("eu-1"), t0.Add(time.Second), t0.Add(time.Second), 30, 1)
			},
		},
		{
			name: "initial creates a Disconnected Lease", status: initial, now: t0, wantWrite: true,
			check: func(t *testing.T, l *coordinationv1.Lease) {
				if l.Spec.HolderIdentity != nil || l.Spec.RenewTime != nil {
					t.Errorf("spec = %+v, want no holder and no renewTime", l.Spec)
				}
				wantAnnotations(t, l, map[string]string{
					AnnotationState: "Disconnected", AnnotationDisconnectReason: ReasonNotConnected, AnnotationDisconnectedAt: "", AnnotationNacks: "",
				})
			},
		},
		{
			name: "initial keeps a Disconnected Lease's last reason", lease: leaseAfter(connected("s1", t0, t0), disconnected("s1", t0, "gone")),
			status: initial, now: t0.Add(time.Hour), wantWrite: false,
		},
		{
			name: "initial leaves a live Connected Lease alone", lease: leaseAfter(connected("s1", t0, t0)),
			status: initial, now: t0.Add(10 * time.Second), wantWrite: false,
		},
		{
			name: "initial leaves a live Connected Lease without a session id alone", lease: leaseAfter(connected("", t0, t0)),
			status: initial, now: t0.Add(10 * time.Second), wantWrite: false,
		},
		{
			name: "initial ends an expired Connected Lease", lease: leaseAfter(connected("s1", t0, t0)),
			status: initial, now: t0.Add(time.Hour), wantWrite: true,
			check: func(t *testing.T, l *coordinationv1.Lease) {
				if l.Spec.HolderIdentity != nil {
					t.Errorf("holderIdentity = %q, want cleared", *l.Spec.HolderIdentity)
				}
				wantAnnotations(t, l, map[string]string{
					AnnotationState: "Disconnected", AnnotationDisconnectReason: ReasonExpired, AnnotationDisconnectedAt: "2026-03-01T12:00:30Z",
					AnnotationNacks: "5", AnnotationEdgeVersion: "v1.2.3",
				})
			},
		},
		{
			name: "a long reason is shortened", lease: leaseAfter(connected("s1", t0, t0)),
			status: disconnected("s1", t0, strings.Repeat("é", 300)), now: t0, wantWrite: true,
			check: func(t *testing.T, l *coordinationv1.Lease) {
				r := l.Annotations[AnnotationDisconnectReason]
				if len(r) > maxTextLength || !utf8.ValidString(r) || !strings.HasSuffix(r, "…") {
					t.Errorf("reason is %d bytes, valid UTF-8 %v: %q", len(r), utf8.ValidString(r), r)
				}
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			l := tt.lease
			if l == nil {
				l = newLease(tt.status, "default")
			}
			before := l.DeepCopy()
			if got := update(l, tt.status, tt.now); got != tt.wantWrite {
				t.Fatalf("update = %v, want %v", got, tt.wantWrite)
			}
			if !tt.wantWrite {
				if l.String() != before.String() {
					t.Errorf("update declined but changed the Lease:\n%v\nto\n%v", before, l)
				}
				return
			}
			tt.check(t, l)
		})
	}
}

// wantSpec checks a Lease's spec; holder nil means cleared.
func wantSpec(t *testing.T, l *coordinationv1.Lease, holder *string, acquire, renew time.Time, duration, transitions int32) {
	t.Helper()
	s := l.Spec
	if !ptrEqual(s.HolderIdentity, holder) {
		t.Errorf("holderIdentity = %v, want %v", ptrString(s.HolderIdentity), ptrString(holder))
	}
	if s.AcquireTime == nil || !s.AcquireTime.Time.Equal(acquire) {
		t.Errorf("acquireTime = %v, want %v", s.AcquireTime, acquire)
	}
	if s.RenewTime == nil || !s.RenewTime.Time.Equal(renew) {
		t.Errorf("renewTime = %v, want %v", s.RenewTime, renew)
	}
	if s.LeaseDurationSeconds == nil || *s.LeaseDurationSeconds != duration {
		t.Errorf("leaseDurationSeconds = %v, want %d", s.LeaseDurationSeconds, duration)
	}
	if s.LeaseTransitions == nil || *s.LeaseTransitions != transitions {
		t.Errorf("leaseTransitions = %v, want %d", s.LeaseTransitions, transitions)
	}
}

// wantAnnotations checks annotations; "" means absent.
func wantAnnotations(t *testing.T, l *coordinationv1.Lease, want map[string]string) {
	t.Helper()
	for k, v := range want {
		if got, ok := l.Annotations[k]; got != v || (v == "" && ok) {
			t.Errorf("annotation %s = %q (present %v), want %q", k, got, ok, v)
		}
	}
}

func stringPtr(s string) *string { return &s }

func int32Ptr(i int32) *int32 { return &i }

func ptrEqual(a, b *string) bool { return (a == nil) == (b == nil) && (a == nil || *a == *b) }

func ptrString(p *string) string {
	if p == nil {
		return "<nil>"
	}
	return *p
}

func TestExpired(t *testing.T) {
	tests := []struct {
		name  string
		lease coordinationv1.LeaseSpec
		now   time.Time
		want  bool
	}{
		{name: "no renewTime", lease: coordinationv1.LeaseSpec{LeaseDurationSeconds: int32Ptr(30)}, now: t0, want: true},
		{name: "no duration", lease: coordinationv1.LeaseSpec{RenewTime: microTime(t0)}, now: t0, want: true},
		{name: "within duration", lease: coordinationv1.LeaseSpec{RenewTime: microTime(t0), LeaseDurationSeconds: int32Ptr(30)}, now: t0.Add(29 * time.Second), want: false},
		{name: "past duration", lease: coordinationv1.LeaseSpec{RenewTime: microTime(t0), LeaseDurationSeconds: int32Ptr(30)}, now: t0.Add(31 * time.Second), want: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := expired(&coordinationv1.Lease{Spec: tt.lease}, tt.now); got != tt.want {
				t.Errorf("expired = %v, want %v", got, tt.want)
			}
		})
	}
}
