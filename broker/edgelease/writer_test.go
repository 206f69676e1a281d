package edgelease

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/go-logr/logr/testr"
	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/kubernetes/fake"
	coordinationv1client "k8s.io/client-go/kubernetes/typed/coordination/v1"
	k8stesting "k8s.io/client-go/testing"

	"github.com/ferry-dev/ferry/broker/config"
)

var leasesResource = schema.GroupResource{Group: "coordination.k8s.io", Resource: "leases"}

// fakeKCP is one fake clientset per workspace.
type fakeKCP struct {
	mu         sync.Mutex
	workspaces map[string]*fake.Clientset
	// setup, when set, runs on every new clientset (reactors).
	setup func(*fake.Clientset)
}

func (f *fakeKCP) Leases(workspace string) (coordinationv1client.LeasesGetter, error) {
	return f.clientset(workspace).CoordinationV1(), nil
}

func (f *fakeKCP) clientset(workspace string) *fake.Clientset {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.workspaces == nil {
		f.workspaces = map[string]*fake.Clientset{}
	}
	cs, ok := f.workspaces[workspace]
	if !ok {
		cs = fake.NewClientset()
		if f.setup != nil {
			f.setup(cs)
		}
		f.workspaces[workspace] = cs
	}
	return cs
}

func (f *fakeKCP) lease(t *testing.T, workspace string, s Status) *coordinationv1.Lease {
	t.Helper()
	// Through the tracker: not recorded among the writer's requests.
	obj, err := f.clientset(workspace).Tracker().Get(coordinationv1.SchemeGroupVersion.WithResource("leases"), "default", s.name())
	if err != nil {
		t.Fatalf("Lease of %s in %s: %v", s.Edge.Identity, workspace, err)
	}
	return obj.(*coordinationv1.Lease)
}

// writes lists the verbs of the Lease requests made in workspace.
func (f *fakeKCP) verbs(workspace string) []string {
	var out []string
	for _, a := range f.clientset(workspace).Actions() {
		if a.GetResource().Resource == "leases" {
			out = append(out, a.GetVerb())
		}
	}
	return out
}

// startWriter runs a writer on kcp until the test ends.
func startWriter(t *testing.T, kcp Clients, mutate ...func(*Options)) *Writer {
	t.Helper()
	o := Options{Clients: kcp, Namespace: "default", RetryInitial: time.Millisecond, RetryMax: 10 * time.Millisecond, Log: testr.New(t)}
	for _, m := range mutate {
		m(&o)
	}
	w := NewWriter(o)
	run(t, w)
	return w
}

// newTestWriter returns a writer on kcp that does not run yet.
func newTestWriter(t *testing.T, kcp Clients) *Writer {
	t.Helper()
	return NewWriter(Options{Clients: kcp, Namespace: "default", RetryInitial: time.Millisecond, RetryMax: 10 * time.Millisecond, Log: testr.New(t)})
}

// run runs w until the test ends.
func run(t *testing.T, w *Writer) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		w.Run(ctx)
	}()
	t.Cleanup(func() {
		cancel()
		<-done
	})
}

func flush(t *testing.T, w *Writer) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := w.Flush(ctx); err != nil {
		t.Fatal(err)
	}
}

func TestWriterWritesEachStatus(t *testing.T) {
	kcp := &fakeKCP{}
	w := startWriter(t, kcp)

	w.Set(connected("s1", t0, t0))
	flush(t, w)
	if l := kcp.lease(t, "root:org", connected("s1", t0, t0)); l.Annotations[AnnotationState] != "Connected" || l.Spec.HolderIdentity == nil {
		t.Fatalf("after connect: %v", l)
	}
	w.Set(connected("s1", t0, t0.Add(10*time.Second)))
	flush(t, w)
	w.Set(disconnected("s1", t0.Add(11*time.Second), "edge closed the stream"))
	flush(t, w)

	l := kcp.lease(t, "root:org", connected("s1", t0, t0))
	if l.Annotations[AnnotationState] != "Disconnected" || l.Spec.HolderIdentity != nil ||
		l.Annotations[AnnotationDisconnectReason] != "edge closed the stream" {
		t.Errorf("after disconnect: %v", l)
	}
	// One read (nothing known yet), then the Lease last written is
	// updated without reading it again.
	want := []string{"get", "create", "update", "update"}
	if got := kcp.verbs("root:org"); !equalStrings(got, want) {
		t.Errorf("requests = %v, want %v", got, want)
	}
}

func TestWriterCoalescesToTheLatestStatus(t *testing.T) {
	kcp := &fakeKCP{}
	release := make(chan struct{})
	kcp.setup = func(cs *fake.Clientset) {
		cs.PrependReactor("get", "leases", func(k8stesting.Action) (bool, runtime.Object, error) {
			<-release // kcp is slow while the statuses pile up
			return false, nil, nil
		})
	}
	w := startWriter(t, kcp)
	other := config.Edge{Identity: "spiffe://example.com/edge/other", Name: "other", APIExport: config.APIExportRef{Workspace: "root:team", Name: "x.example.com"}}

	start := time.Now()
	for i := range 1000 {
		w.Set(connected("s1", t0, t0.Add(time.Duration(i)*time.Second)))
		s := connected("s9", t0, t0.Add(time.Duration(i)*time.Second))
		s.Edge = other
		w.Set(s)
	}
	w.Set(disconnected("s1", t0.Add(time.Hour), "last"))
	if elapsed := time.Since(start); elapsed > 2*time.Second {
		t.Errorf("Set blocked while kcp was slow: 2001 calls took %s", elapsed)
	}
	if n := w.Pending(); n != 2 {
		t.Errorf("pending = %d, want 2 (one status per identity)", n)
	}
	close(release)
	flush(t, w)

	if l := kcp.lease(t, "root:org", connected("s1", t0, t0)); l.Annotations[AnnotationDisconnectReason] != "last" {
		t.Errorf("root:org Lease shows %v, want the last status", l.Annotations)
	}
	for _, ws := range []string{"root:org", "root:team"} {
		// The status being written when kcp stalled, then the latest.
		if writes := len(kcp.verbs(ws)); writes > 4 {
			t.Errorf("%s: %d requests for 1000 statuses: %v", ws, writes, kcp.verbs(ws))
		}
	}
}

func TestWriterRetries(t *testing.T) {
	tests := []struct {
		name string
		// failing makes a reactor; it runs before the fake's own.
		verb    string
		failure func(n int64) error
		want    []string
	}{
		{
			name: "conflict reads again", verb: "update",
			failure: func(n int64) error {
				if n == 1 {
					return apierrors.NewConflict(leasesResource, "x", errors.New("changed"))
				}
				return nil
			},
			want: []string{"get", "create", "update", "get", "update"},
		},
		{
			name: "kcp errors are retried with backoff", verb: "create",
			failure: func(n int64) error {
				if n <= 3 {
					return apierrors.NewServiceUnavailable("kcp is restarting")
				}
				return nil
			},
			want: []string{"get", "create", "get", "create", "get", "create", "get", "create", "update"},
		},
		{
			name: "a Lease created meanwhile is read", verb: "create",
			failure: func(n int64) error {
				if n == 1 {
					return apierrors.NewAlreadyExists(leasesResource, "x")
				}
				return nil
			},
			want: []string{"get", "create", "get", "create", "update"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			kcp := &fakeKCP{}
			var calls atomic.Int64
			kcp.setup = func(cs *fake.Clientset) {
				cs.PrependReactor(tt.verb, "leases", func(k8stesting.Action) (bool, runtime.Object, error) {
					if err := tt.failure(calls.Add(1)); err != nil {
						return true, nil, err
					}
					return false, nil, nil
				})
			}
			w := startWriter(t, kcp)
			w.Set(connected("s1", t0, t0))
			flush(t, w)
			w.Set(connected("s1", t0, t0.Add(time.Second)))
			flush(t, w)
			if got := kcp.verbs("root:org"); !equalStrings(got, tt.want) {
				t.Errorf("requests = %v, want %v", got, tt.want)
			}
			if l := kcp.lease(t, "root:org", connected("s1", t0, t0)); !l.Spec.RenewTime.Time.Equal(t0.Add(time.Second)) {
				t.Errorf("renewTime = %v, want the last status's", l.Spec.RenewTime)
			}
		})
	}
}

func TestWriterDuringAKCPOutage(t *testing.T) {
	kcp := &fakeKCP{}
	var down atomic.Bool
	down.Store(true)
	kcp.setup = func(cs *fake.Clientset) {
		cs.PrependReactor("*", "leases", func(k8stesting.Action) (bool, runtime.Object, error) {
			if down.Load() {
				return true, nil, apierrors.NewServiceUnavailable("kcp is down")
			}
			return false, nil, nil
		})
	}
	w := startWriter(t, kcp, func(o *Options) { o.RetryInitial, o.RetryMax = time.Hour, time.Hour })
	w.Set(connected("s1", t0, t0))
	waitFor(t, "the first attempt", func() bool { return len(kcp.verbs("root:org")) == 1 })

	// Renewals during the outage wait for the retry (an hour away): no
	// request each, one status kept.
	for i := range 100 {
		w.Set(connected("s1", t0, t0.Add(time.Duration(i)*time.Second)))
	}
	time.Sleep(50 * time.Millisecond)
	if got := kcp.verbs("root:org"); len(got) != 1 {
		t.Errorf("requests during the backoff = %v, want the first attempt only", got)
	}
	if n := w.Pending(); n != 1 {
		t.Errorf("pending during the outage = %d, want 1", n)
	}

	// Flush gives up at its deadline while kcp is down...
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	if err := w.Flush(ctx); err == nil {
		t.Fatal("Flush succeeded while kcp was down")
	}
	// ...and, once kcp is back, writes the latest status at once instead of
	// after the backoff.
	down.Store(false)
	flush(t, w)
	if l := kcp.lease(t, "root:org", connected("s1", t0, t0)); !l.Spec.RenewTime.Time.Equal(t0.Add(99 * time.Second)) {
		t.Errorf("renewTime = %v, want the latest status's", l.Spec.RenewTime)
	}
	// Writes follow each status again.
	before := len(kcp.verbs("root:org"))
	w.Set(connected("s1", t0, t0.Add(time.Hour)))
	flush(t, w)
	if got := kcp.verbs("root:org")[before:]; !equalStrings(got, []string{"update"}) {
		t.Errorf("requests after the outage = %v, want one update", got)
	}
}

func waitFor(t *testing.T, what string, ok func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !ok() {
		if time.Now().After(deadline) {
			t.Fatalf("never %s", what)
		}
		time.Sleep(time.Millisecond)
	}
}

func TestWriterLeavesALeaseAnotherSessionHolds(t *testing.T) {
	kcp := &fakeKCP{}
	now := t0.Add(time.Second)
	w := startWriter(t, kcp, func(o *Options) { o.Now = func() time.Time { return now } })
	w.Set(connected("new", t0.Add(time.Second), t0.Add(time.Second)))
	flush(t, w)
	// The broker that held an older session ends it late.
	w.Set(disconnected("old", t0.Add(2*time.Second), "no message from the edge"))
	flush(t, w)
	l := kcp.lease(t, "root:org", connected("new", t0, t0))
	if l.Annotations[AnnotationState] != "Connected" || l.Annotations[AnnotationSessionID] != "new" {
		t.Errorf("a late disconnect of another session changed the Lease: %v", l.Annotations)
	}
	if got, want := kcp.verbs("root:org"), []string{"get", "create"}; !equalStrings(got, want) {
		t.Errorf("requests = %v, want %v", got, want)
	}
}

func equalStrings(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}
