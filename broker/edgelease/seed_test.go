package edgelease

import (
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"

	"github.com/ferry-dev/ferry/broker/config"
)

// edges are n configured edges serving an APIExport each in workspace ws.
func edges(ws string, n int) []config.Edge {
	out := make([]config.Edge, n)
	for i := range out {
		out[i] = config.Edge{
			Identity:  fmt.Sprintf("spiffe://example.com/edge/%s-%d", ws, i),
			Name:      fmt.Sprintf("edge-%d", i),
			APIExport: config.APIExportRef{Workspace: ws, Name: fmt.Sprintf("e%d.example.com", i)},
		}
	}
	return out
}

func initial(e config.Edge) Status {
	return Status{Edge: e, State: Disconnected, Initial: true, Reason: ReasonNotConnected}
}

// startWith writes the initial statuses of edges as a starting broker does:
// set before the writer runs, then flushed.
func startWith(t *testing.T, kcp Clients, edges []config.Edge) *Writer {
	t.Helper()
	w := newTestWriter(t, kcp)
	for _, e := range edges {
		w.Set(initial(e))
	}
	run(t, w)
	flush(t, w)
	return w
}

// A broker restarting with 50 configured edges whose Leases exist lists the
// workspace's Leases once and reads none of them.
func TestWriterStartListsEachWorkspaceOnce(t *testing.T) {
	kcp := &fakeKCP{}
	org, team := edges("root:org", 50), edges("root:team", 7)
	startWith(t, kcp, append(append([]config.Edge{}, org...), team...)) // the broker's first start creates them
	for _, ws := range []string{"root:org", "root:team"} {
		kcp.clientset(ws).ClearActions()
	}

	w := startWith(t, kcp, append(append([]config.Edge{}, org...), team...)) // the restart
	for _, ws := range []string{"root:org", "root:team"} {
		if got := kcp.verbs(ws); !equalStrings(got, []string{"list"}) {
			t.Errorf("%s: requests at start = %v, want one list", ws, got)
		}
	}
	// The listed Leases are what the writer knows: a connect updates at
	// once.
	s := connected("s1", t0, t0)
	s.Edge = org[3]
	w.Set(s)
	flush(t, w)
	if got := kcp.verbs("root:org"); !equalStrings(got, []string{"list", "update"}) {
		t.Errorf("requests after a connect = %v, want list, update", got)
	}
}

func TestWriterStartSeed(t *testing.T) {
	org := edges("root:org", 5)
	tests := []struct {
		name string
		// existing: the Leases exist before the start.
		existing bool
		// before runs on the fake after the Leases exist (reactors).
		before func(cs *fake.Clientset)
		want   []string
	}{
		{
			name: "missing Leases are created without reading them",
			want: []string{"list", "create", "create", "create", "create", "create"},
		},
		{
			name: "a failed List falls back to reading each Lease", existing: true,
			before: func(cs *fake.Clientset) {
				cs.PrependReactor("list", "leases", func(k8stesting.Action) (bool, runtime.Object, error) {
					return true, nil, apierrors.NewServiceUnavailable("kcp is restarting")
				})
			},
			want: []string{"list", "get", "get", "get", "get", "get"},
		},
		{
			name: "a Lease created after the List is read",
			before: func(cs *fake.Clientset) {
				var calls atomic.Int32
				cs.PrependReactor("create", "leases", func(k8stesting.Action) (bool, runtime.Object, error) {
					if calls.Add(1) == 1 {
						return true, nil, apierrors.NewAlreadyExists(leasesResource, "x")
					}
					return false, nil, nil
				})
			},
			want: []string{"list", "create", "get", "create", "create", "create", "create", "create"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			kcp := &fakeKCP{}
			if tt.existing {
				startWith(t, kcp, org)
			}
			cs := kcp.clientset("root:org")
			cs.ClearActions()
			if tt.before != nil {
				tt.before(cs)
			}
			startWith(t, kcp, org)
			got := kcp.verbs("root:org")
			if !sameVerbs(got, tt.want) {
				t.Errorf("requests = %v, want (in any order after the list) %v", got, tt.want)
			}
			for _, e := range org {
				if l := kcp.lease(t, "root:org", initial(e)); l.Annotations[AnnotationState] != string(Disconnected) {
					t.Errorf("%s: %v", e.Identity, l.Annotations)
				}
			}
		})
	}
}

// The Lease of an edge whose broker was killed while it was connected is
// ended from the List, without reading it.
func TestWriterStartEndsAnExpiredLeaseFromTheList(t *testing.T) {
	kcp := &fakeKCP{}
	org := edges("root:org", 3)
	w := startWith(t, kcp, org)
	s := connected("s1", t0, t0) // renewed last at t0, 30 s Lease: long expired
	s.Edge = org[1]
	w.Set(s)
	flush(t, w)
	kcp.clientset("root:org").ClearActions()

	startWith(t, kcp, org)
	if got := kcp.verbs("root:org"); !equalStrings(got, []string{"list", "update"}) {
		t.Errorf("requests = %v, want list, update", got)
	}
	l := kcp.lease(t, "root:org", initial(org[1]))
	if l.Annotations[AnnotationDisconnectReason] != ReasonExpired || l.Spec.HolderIdentity != nil {
		t.Errorf("the expired Lease shows %v", l.Annotations)
	}
	if at := l.Annotations[AnnotationDisconnectedAt]; at != rfc3339(t0.Add(30*time.Second)) {
		t.Errorf("disconnected-at = %s, want the Lease's expiry", at)
	}
}

// sameVerbs: a and b hold the same verbs, the first one equal (the writer's
// workers run in parallel).
func sameVerbs(a, b []string) bool {
	if len(a) != len(b) || (len(a) > 0 && a[0] != b[0]) {
		return false
	}
	count := map[string]int{}
	for i := range a {
		count[a[i]]++
		count[b[i]]--
	}
	for _, n := range count {
		if n != 0 {
			return false
		}
	}
	return true
}
