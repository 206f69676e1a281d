package replication

import (
	"context"
	"errors"
	"slices"
	"testing"

	"github.com/go-logr/logr"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/rest"

	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
	ferryv1alpha1 "github.com/ferry-dev/ferry/api/v1alpha1"
	"github.com/ferry-dev/ferry/pkg/naming"
	"github.com/ferry-dev/ferry/pkg/related"
)

var thingsGVR = schema.GroupVersionResource{Group: "g", Version: "v1", Resource: "things"}

func thingKey() *ferryv1.ObjectKey {
	return &ferryv1.ObjectKey{Cluster: "c", Resource: &ferryv1.GroupVersionResource{Group: "g", Version: "v1", Resource: "things"},
		Namespace: "ns", Name: "a", Uid: "u-a"}
}

func namespaceObj(cluster, name string, lbls map[string]string) *unstructured.Unstructured {
	u := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "Namespace",
		"metadata": map[string]any{"name": name, "annotations": map[string]any{"kcp.io/cluster": cluster}}}}
	u.SetLabels(lbls)
	return u
}

func withLabels(u *unstructured.Unstructured, l map[string]string) *unstructured.Unstructured {
	u.SetLabels(l)
	return u
}

func withoutFinalizer(u *unstructured.Unstructured) *unstructured.Unstructured {
	u.SetFinalizers(nil)
	return u
}

func deleting(u *unstructured.Unstructured) *unstructured.Unstructured {
	now := metav1.Now()
	u.SetDeletionTimestamp(&now)
	return u
}

// TestObjectsLeavingScopeAreDeletedNotStranded: the broker watches without
// filters, so an object relabelled out of filter.resource, or whose
// namespace's labels leave filter.namespace, is seen (not as a deletion):
// its copy is deleted and then its finalizer released. Before, the watch
// was filtered server-side and such an object kept the finalizer for good.
func TestObjectsLeavingScopeAreDeletedNotStranded(t *testing.T) {
	spec := map[string]any{"size": int64(1)}
	team := labels.SelectorFromSet(labels.Set{"team": "a"})
	nsSel := labels.SelectorFromSet(labels.Set{"sync": "yes"})
	cases := []struct {
		name       string
		obj        *unstructured.Unstructured
		selector   labels.Selector
		nsSelector labels.Selector
		namespace  *unstructured.Unstructured // in the namespace cache
		nsName     string                     // filter.namespace written as a name
		want       string                     // "delete", "upsert" or ""
	}{
		{name: "in scope", obj: withLabels(thing("1", spec, nil), map[string]string{"team": "a"}), selector: team, want: "upsert"},
		{name: "relabelled out of filter.resource", obj: thing("2", spec, nil), selector: team, want: "delete"},
		{name: "out of filter, never finalized", obj: withoutFinalizer(thing("3", spec, nil)), selector: team, want: ""},
		{name: "deleting in kcp", obj: deleting(thing("4", spec, nil)), selector: labels.Everything(), want: "delete"},
		{name: "deleting, finalizer already released", obj: withoutFinalizer(deleting(thing("5", spec, nil))), selector: labels.Everything(), want: ""},
		{name: "namespace left filter.namespace", obj: thing("6", spec, nil), selector: labels.Everything(), nsSelector: nsSel,
			namespace: namespaceObj("c", "ns", map[string]string{"sync": "no"}), want: "delete"},
		{name: "namespace in filter.namespace", obj: thing("7", spec, nil), selector: labels.Everything(), nsSelector: nsSel,
			namespace: namespaceObj("c", "ns", map[string]string{"sync": "yes"}), want: "upsert"},
		{name: "namespace not cached yet: nothing is decided", obj: thing("8", spec, nil), selector: labels.Everything(), nsSelector: nsSel, want: ""},
		{name: "in the namespace filter.namespace names", obj: thing("9", spec, nil), selector: labels.Everything(), nsName: "ns", want: "upsert"},
		{name: "in another namespace than filter.namespace names", obj: thing("10", spec, nil), selector: labels.Everything(), nsName: "my-app", want: "delete"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			res := thingsResource()
			res.Selector, res.NamespaceSelector, res.NamespaceName = tc.selector, tc.nsSelector, tc.nsName
			objs := []*unstructured.Unstructured{tc.obj}
			if tc.namespace != nil {
				objs = append(objs, tc.namespace)
			}
			e := newEnv(t, res, objs...)
			m, intents := e.m, e.intents
			if tc.namespace != nil {
				eventually(t, "the namespace is cached", func() bool { return m.namespaceCached("c", "ns") })
			}
			drain(t, m)
			in := intents.Next()
			got := ""
			switch {
			case in.GetDelete() != nil:
				got = "delete"
			case in.GetUpsert() != nil:
				got = "upsert"
			}
			if got != tc.want {
				t.Fatalf("intent %q, want %q", got, tc.want)
			}
		})
	}
}

// TestReleaseOnlyWhatTheBrokerAskedToDelete: a deletion confirmation
// releases the finalizer only while the broker itself wants the copy
// deleted; a forged one for an object in scope is refused (and counted)
// and the kcp object is untouched.
func TestReleaseOnlyWhatTheBrokerAskedToDelete(t *testing.T) {
	spec := map[string]any{"size": int64(1)}
	team := labels.SelectorFromSet(labels.Set{"team": "a"})
	cases := []struct {
		name     string
		obj      *unstructured.Unstructured
		refused  bool
		released bool
	}{
		{name: "in scope, not deleting: forged", obj: withLabels(thing("1", spec, nil), map[string]string{"team": "a"}), refused: true},
		{name: "out of scope", obj: thing("2", spec, nil), released: true},
		{name: "deleting in kcp", obj: withLabels(deleting(thing("3", spec, nil)), map[string]string{"team": "a"}), released: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			res := thingsResource()
			res.Selector = team
			e := newEnv(t, res, tc.obj)
			m, client := e.m, e.kcp
			err := m.Release(context.Background(), "pr", thingKey())
			if got := errors.Is(err, ErrNotDeleting); got != tc.refused {
				t.Fatalf("refused = %v (%v), want %v", got, err, tc.refused)
			}
			if tc.refused && m.Refused() != 1 {
				t.Errorf("refusals counted: %d, want 1", m.Refused())
			}
			if !tc.refused && err != nil {
				t.Fatalf("release: %v", err)
			}
			got, err := client.Resource(thingsGVR).Namespace("ns").Get(context.Background(), "a", metav1.GetOptions{})
			if err != nil {
				t.Fatal(err)
			}
			if has := slices.Contains(got.GetFinalizers(), "ferry.dev/nora"); has == tc.released {
				t.Fatalf("finalizers in kcp %v; released want %v", got.GetFinalizers(), tc.released)
			}
		})
	}
}

// TestReportsOnlyForObjectsTheBrokerSyncs: a status report for an object
// without the edge's finalizer, or outside the filters, is refused: the
// edge cannot write into objects it was not sent.
func TestReportsOnlyForObjectsTheBrokerSyncs(t *testing.T) {
	spec := map[string]any{"size": int64(1)}
	team := labels.SelectorFromSet(labels.Set{"team": "a"})
	cases := []struct {
		name    string
		obj     *unstructured.Unstructured
		refused bool
	}{
		{name: "synced", obj: withLabels(thing("1", spec, nil), map[string]string{"team": "a"})},
		{name: "never finalized (not sent)", obj: withoutFinalizer(withLabels(thing("2", spec, nil), map[string]string{"team": "a"})), refused: true},
		{name: "outside the filter", obj: thing("3", spec, nil), refused: true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			res := thingsResource()
			res.Selector, res.HasStatus = team, true
			e := newEnv(t, res, tc.obj)
			m, client := e.m, e.kcp
			written, err := m.WriteStatus(context.Background(), "pr", thingKey(), []byte(`{"ready":true}`))
			if got := errors.Is(err, ErrRefused); got != tc.refused {
				t.Fatalf("refused = %v (%v), want %v", got, err, tc.refused)
			}
			got, _ := client.Resource(thingsGVR).Namespace("ns").Get(context.Background(), "a", metav1.GetOptions{})
			_, hasStatus := got.Object["status"]
			if hasStatus != written || written == tc.refused {
				t.Fatalf("written %v, status in kcp %v, refused %v", written, hasStatus, tc.refused)
			}
		})
	}
}

// TestReleaseAllReleasesEveryObject: a deleted PublishedResource (or one
// whose sync is disabled) releases the finalizer on every object of its
// resource, listed live, and stops syncing it.
func TestReleaseAllReleasesEveryObject(t *testing.T) {
	spec := map[string]any{"size": int64(1)}
	a := thing("1", spec, nil)
	b := thing("2", spec, nil)
	b.SetName("b")
	b.SetUID("u-b")
	b.SetFinalizers([]string{"other.example/keep", "ferry.dev/nora"})
	e := newEnv(t, thingsResource(), a, b)
	m, client := e.m, e.kcp
	n, err := m.ReleaseAll(context.Background(), "pr", thingsGVR, false)
	if err != nil || n != 2 {
		t.Fatalf("released %d, %v; want 2", n, err)
	}
	for name, want := range map[string][]string{"a": nil, "b": {"other.example/keep"}} {
		got, err := client.Resource(thingsGVR).Namespace("ns").Get(context.Background(), name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		if !slices.Equal(got.GetFinalizers(), want) {
			t.Errorf("%s: finalizers %v, want %v", name, got.GetFinalizers(), want)
		}
	}
	if _, ok := m.PublishedResourceFor(thingKey()); ok {
		t.Error("the PublishedResource is still synced")
	}
}

// TestRejectedIntentWaitsForAChange: an intent the edge refused with a
// final error (invalid, forbidden, a failing mutation) used to be retried
// every few minutes forever, each retry an Event. Now it is sent again
// only when the kcp object's desired state or the PublishedResource
// changes.
func TestRejectedIntentWaitsForAChange(t *testing.T) {
	obj := thing("1", map[string]any{"size": int64(1)}, nil)
	e := newEnv(t, thingsResource(), obj)
	m, intents := e.m, e.intents
	drain(t, m)
	in := intents.Next()
	if in.GetUpsert() == nil {
		t.Fatalf("want the upsert first, got %v", in)
	}
	intents.Done(in.GetKey(), nil, in.GetVersion())
	m.Rejected("pr", in.GetKey(), "")

	// A status write in kcp (same desired state) sends nothing.
	e.changed(thing("2", map[string]any{"size": int64(1)}, map[string]any{"ready": true}))
	drain(t, m)
	if again := intents.Next(); again != nil {
		t.Fatalf("a rejected intent was sent again without a change: %v", again)
	}

	// The PublishedResource changed: the object is tried again.
	e.ensure(thingsResource())
	drain(t, m)
	if again := intents.Next(); again.GetUpsert() == nil {
		t.Fatalf("after a PublishedResource change: want the upsert again, got %v", again)
	}
}

// TestReleaseAllWithoutBindings: a PublishedResource deleted while no
// workspace binds the export has nothing to release (it used to wait for a
// virtual workspace that never comes); before the broker knows whether
// there is one, it retries.
func TestReleaseAllWithoutBindings(t *testing.T) {
	m := NewManager(Options{KCP: &rest.Config{Host: "https://kcp.invalid"}, EdgeName: "nora", Outbox: NewIntents(1, 100, nil), Log: logr.Discard(),
		NewClient: newFakeKCP().newClient})
	m.Ensure(thingsResource())
	if _, err := m.ReleaseAll(context.Background(), "pr", thingsGVR, false); err == nil {
		t.Fatal("released before the virtual workspace was known")
	}
	m.SetVirtualWorkspace(nil)
	if n, err := m.ReleaseAll(context.Background(), "pr", thingsGVR, false); err != nil || n != 0 {
		t.Fatalf("no bindings: released %d, %v; want 0, nil", n, err)
	}
}

// TestReleaseAllWithDeletePolicyDeletesRelatedCopies: deletionPolicy
// Delete also deletes the service-origin related copies the broker wrote
// into kcp for the released objects, and only those (one list per kind).
func TestReleaseAllWithDeletePolicyDeletesRelatedCopies(t *testing.T) {
	refs, err := related.Compile([]ferryv1alpha1.RelatedResourceSpec{{
		Identifier: "tls", Origin: ferryv1alpha1.OriginService, Kind: "Secret",
		Reference: &ferryv1alpha1.RelatedResourceReference{Name: ferryv1alpha1.ResourceLocator{Path: "spec.secretName"}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	a := thing("1", map[string]any{"secretName": "a-tls"}, nil)
	secret := func(name, owner string) *unstructured.Unstructured {
		u := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "Secret"}}
		u.SetNamespace("ns")
		u.SetName(name)
		u.SetLabels(map[string]string{naming.LabelRelatedTo: owner, naming.LabelRelatedIdentifier: "tls"})
		return u
	}
	for _, deleteRelated := range []bool{false, true} {
		res := thingsResource()
		res.Related = refs
		e := newEnv(t, res, a, secret("a-tls", "u-a"), secret("other-tls", "u-other"))
		m, client, secrets := e.m, e.kcp, refs[0].Resource
		if _, err := m.ReleaseAll(context.Background(), "pr", thingsGVR, deleteRelated); err != nil {
			t.Fatal(err)
		}
		list, err := client.Resource(secrets).Namespace("ns").List(context.Background(), metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		var left []string
		for _, s := range list.Items {
			left = append(left, s.GetName())
		}
		slices.Sort(left)
		want := []string{"a-tls", "other-tls"}
		if deleteRelated {
			want = []string{"other-tls"}
		}
		if !slices.Equal(left, want) {
			t.Errorf("delete related %v: copies left %v, want %v", deleteRelated, left, want)
		}
	}
}
