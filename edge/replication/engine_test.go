package replication

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"google.golang.org/protobuf/proto"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	clientfeatures "k8s.io/client-go/features"
	clientfeaturestesting "k8s.io/client-go/features/testing"
	kubefake "k8s.io/client-go/kubernetes/fake"
	clienttesting "k8s.io/client-go/testing"

	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
	"github.com/ferry-dev/ferry/pkg/naming"
	"github.com/ferry-dev/ferry/pkg/objects"
)

type recordingSink struct{ msgs []*ferryv1.ConnectRequest }

func (s *recordingSink) Control(m *ferryv1.ConnectRequest) error {
	s.msgs = append(s.msgs, m)
	return nil
}

var (
	remoteGVR = schema.GroupVersionResource{Group: "kcp.example", Version: "v1", Resource: "things"}
	localGVR  = schema.GroupVersionResource{Group: "svc.example", Version: "v1", Resource: "things"}
)

// testEngine returns a running engine (without workers: tests drive the
// apply queue with runQueue) over a fake service cluster holding objs,
// with one PublishedResource registered through SetPublished, connected
// to a recording sink. It waits until the engine has listed its namespaces
// and its local copies (synced), or, with synced false, until listing the
// local copies failed (the fake cluster forbids it). Options change the
// PublishedResource before it is registered.
func testEngine(t *testing.T, synced bool, objs ...runtime.Object) (*Engine, *localWatch, *recordingSink) {
	t.Helper()
	return testEngineWith(t, engineSetup{unsynced: !synced}, objs...)
}

// engineSetup varies testEngine's engine.
type engineSetup struct {
	// unsynced: listing the local copies is forbidden.
	unsynced bool
	// related are the PublishedResource's related objects.
	related []Related
	// relatedClusterWide is Options.RelatedClusterWide.
	relatedClusterWide bool
	// published changes the PublishedResource before it is registered.
	published func(*Published)
	// observer is Options.Observer.
	observer Observer
	// namespacesForbidden: listing namespaces is forbidden (the engine
	// never knows the namespaces it created).
	namespacesForbidden bool
	// stalledWatch: the watch of the local copies sends nothing after the
	// list (the cache misses what is created since).
	stalledWatch bool
	// relatedListForbiddenIn: listing related objects in this namespace is
	// forbidden (its related cache never lists).
	relatedListForbiddenIn string
	// kubeObjs are more objects of the typed service-cluster client
	// (namespaces ferry did not make, Secrets).
	kubeObjs []runtime.Object
}

func testEngineWith(t *testing.T, setup engineSetup, objs ...runtime.Object) (*Engine, *localWatch, *recordingSink) {
	t.Helper()
	e := liveEngineWith(t, setup, objs...)
	rules, err := naming.Compile(nil)
	if err != nil {
		t.Fatal(err)
	}
	pub := &Published{Name: "pr", Remote: remoteGVR, Local: localGVR, LocalKind: "Thing", Namespaced: true, Naming: rules, Related: setup.related}
	if setup.published != nil {
		setup.published(pub)
	}
	e.SetPublished(pub)
	waitFor(t, func() (bool, string) {
		r := e.Resources()
		if len(r) != 1 {
			return false, fmt.Sprintf("%d resources", len(r))
		}
		if setup.unsynced {
			return r[0].GetWatchError() != "", "the local watch has not failed yet"
		}
		if !r[0].GetListed() {
			return false, "the local copies are not listed yet"
		}
		if len(setup.related) == 0 {
			return true, ""
		}
		e.mu.Lock()
		defer e.mu.Unlock()
		for _, rel := range setup.related {
			rw := e.relWatches[rel.Local]
			if rw == nil || len(rw.spaces) == 0 {
				return false, "no related watch of " + rel.Local.String()
			}
			for ns, space := range rw.spaces {
				if !space.synced && ns != setup.relatedListForbiddenIn {
					return false, fmt.Sprintf("the related watch of %s in %q has not listed", rel.Local.String(), ns)
				}
			}
		}
		return true, ""
	})
	e.mu.Lock()
	w := e.watches["pr"]
	e.mu.Unlock()
	// Listing queued the Synced condition; tests see only their own work.
	for e.queue.Len() > 0 {
		k, _ := e.queue.Get()
		e.queue.Done(k)
	}
	sink := &recordingSink{}
	e.Attach(sink)
	return e, w, sink
}

// liveEngineWith returns a running engine (without workers) over a fake
// service cluster holding objs and namespace local-ns, which ferry made for
// workspace c1, once it has listed its namespaces.
func liveEngineWith(t *testing.T, setup engineSetup, objs ...runtime.Object) *Engine {
	t.Helper()
	// The fake client cannot stream a watch's initial list.
	clientfeaturestesting.SetFeatureDuringTest(t, clientfeatures.WatchListClient, false)
	nsLabels := map[string]string{naming.LabelAgent: "nora", naming.LabelWorkspace: "c1"}
	localNS := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "Namespace"}}
	localNS.SetName("local-ns")
	localNS.SetLabels(nsLabels)
	dyn := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(),
		map[schema.GroupVersionResource]string{localGVR: "ThingList", namespacesGVR: "NamespaceList", secretsGVR: "SecretList", configMapsGVR: "ConfigMapList"}, append(objs, localNS)...)
	// The fake client's watches ignore label selectors; the API server's
	// do not (a copy of another agent name is never seen).
	dyn.PrependWatchReactor("*", func(a clienttesting.Action) (bool, watch.Interface, error) {
		w, err := dyn.Tracker().Watch(a.GetResource(), a.GetNamespace())
		if err != nil {
			return true, nil, err
		}
		sel := a.(clienttesting.WatchAction).GetWatchRestrictions().Labels
		if sel == nil || sel.Empty() {
			return true, w, nil
		}
		// As the API server does, an object this watch sent that leaves the
		// selector is sent as deleted, in its last matching state. (Only
		// the filter's goroutine uses seen.)
		seen := map[string]runtime.Object{}
		return true, watch.Filter(w, func(ev watch.Event) (watch.Event, bool) {
			m, err := meta.Accessor(ev.Object)
			if err != nil {
				return ev, true
			}
			key := m.GetNamespace() + "/" + m.GetName()
			if sel.Matches(labels.Set(m.GetLabels())) {
				if ev.Type == watch.Deleted {
					delete(seen, key)
				} else {
					seen[key] = ev.Object.DeepCopyObject()
				}
				return ev, true
			}
			if prev, ok := seen[key]; ok && ev.Type == watch.Modified {
				delete(seen, key)
				return watch.Event{Type: watch.Deleted, Object: prev}, true
			}
			return ev, false
		}), nil
	})
	if setup.stalledWatch {
		dyn.PrependWatchReactor(localGVR.Resource, func(clienttesting.Action) (bool, watch.Interface, error) {
			return true, watch.NewFake(), nil
		})
	}
	if setup.unsynced {
		dyn.PrependReactor("list", localGVR.Resource, func(clienttesting.Action) (bool, runtime.Object, error) {
			return true, nil, errListForbidden
		})
	}
	if ns := setup.relatedListForbiddenIn; ns != "" {
		dyn.PrependReactor("list", secretsGVR.Resource, func(a clienttesting.Action) (bool, runtime.Object, error) {
			if a.GetNamespace() != ns {
				return false, nil, nil
			}
			return true, nil, forbidden("secrets is forbidden: cannot list in " + ns)
		})
	}
	if setup.namespacesForbidden {
		dyn.PrependReactor("list", namespacesGVR.Resource, func(clienttesting.Action) (bool, runtime.Object, error) {
			return true, nil, forbidden("namespaces is forbidden: cannot list")
		})
	}
	kube := kubefake.NewClientset(append([]runtime.Object{&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "local-ns", Labels: nsLabels}}},
		setup.kubeObjs...)...)
	e := NewEngine(Options{Agent: "nora", Dynamic: dyn, Kube: kube, Wake: func() {}, Log: logr.Discard(),
		RelatedClusterWide: setup.relatedClusterWide, Observer: setup.observer})
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	if err := e.Run(ctx, 0); err != nil {
		t.Fatal(err)
	}
	if !setup.namespacesForbidden {
		waitFor(t, func() (bool, string) {
			e.mu.Lock()
			defer e.mu.Unlock()
			return e.nsSynced, "the namespaces are not listed yet"
		})
	}
	return e
}

// waitFor polls cond until it holds, failing after 10 seconds with its
// last reason.
func waitFor(t *testing.T, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		ok, why := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting: %s", why)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func remoteThing() (*ferryv1.ObjectKey, naming.Remote) {
	key := &ferryv1.ObjectKey{Cluster: "c1", Resource: &ferryv1.GroupVersionResource{Group: remoteGVR.Group, Version: "v1", Resource: "things"},
		Namespace: "team", Name: "a", Uid: "u-a"}
	return key, naming.Remote{ClusterName: "c1", Namespace: "team", Name: "a", UID: "u-a"}
}

func localCopy(remote naming.Remote) *unstructured.Unstructured {
	u := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "svc.example/v1", "kind": "Thing"}}
	u.SetNamespace("local-ns")
	u.SetName("a-copy")
	u.SetLabels(objects.MergeStrings(naming.Labels("nora", remote), naming.OwnerLabels(remoteGVR.GroupResource(), "pr")))
	u.SetAnnotations(naming.Annotations(remote))
	return u
}

// runQueue processes the apply queue until it is empty, failing on a
// requeue loop.
func runQueue(t *testing.T, e *Engine) {
	t.Helper()
	for rounds := 0; e.queue.Len() > 0; rounds++ {
		if rounds > 10 {
			t.Fatal("requeue loop: the apply queue does not drain")
		}
		e.next(context.Background())
	}
}

func reportsQueued(e *Engine) []*ferryv1.ConnectRequest {
	var out []*ferryv1.ConnectRequest
	for {
		m, ok := e.Next()
		if !ok {
			return out
		}
		if m.GetInventory() == nil {
			out = append(out, m)
		}
	}
}

// TestDeleteAfterCreateOnCacheMiss is the quick create → delete: the copy
// exists in the service cluster but the informer has not seen this edge's
// own apply yet. The deletion must not be confirmed before the copy is gone.
func TestDeleteAfterCreateOnCacheMiss(t *testing.T) {
	key, _ := remoteThing()
	e, _, sink := testEngineWith(t, engineSetup{stalledWatch: true})
	storeApplies(t, e)
	// Applied by this engine; its cache does not see it.
	e.Handle(&ferryv1.SyncIntent{Key: key, Version: &ferryv1.ObjectVersion{Sequence: 1}, PublishedResource: "pr",
		Operation: &ferryv1.SyncIntent_Upsert{Upsert: &ferryv1.UpsertIntent{ContentHash: "h",
			Object: []byte(`{"apiVersion":"kcp.example/v1","kind":"Thing","metadata":{"name":"a","namespace":"team"}}`)}}})
	runQueue(t, e)
	if len(sink.msgs) != 1 || sink.msgs[0].GetIntentResult().GetError() != nil {
		t.Fatalf("want the upsert acked, got %v", sink.msgs)
	}
	ns, name := sink.msgs[0].GetIntentResult().GetLocalNamespace(), sink.msgs[0].GetIntentResult().GetLocalName()
	_ = reportsQueued(e)

	e.Handle(&ferryv1.SyncIntent{Key: key, Version: &ferryv1.ObjectVersion{Sequence: 2}, PublishedResource: "pr",
		Operation: &ferryv1.SyncIntent_Delete{Delete: &ferryv1.DeleteIntent{}}})
	runQueue(t, e)

	if len(sink.msgs) != 2 || sink.msgs[1].GetIntentResult().GetError() != nil {
		t.Fatalf("want the delete acked, got %v", sink.msgs[1:])
	}
	for _, m := range reportsQueued(e) {
		if m.GetDeletionConfirmation() != nil {
			t.Fatal("deletion confirmed while the local copy still existed")
		}
	}
	if _, err := e.opts.Dynamic.Resource(localGVR).Namespace(ns).Get(context.Background(), name, getOpts); !apierrors.IsNotFound(err) {
		t.Fatalf("the local copy %s was not deleted: %v", nsName(ns, name), err)
	}
}

// storeApplies makes the fake service cluster keep what the engine applies
// to local copies (the fake client cannot server-side apply unstructured
// objects): created, or replaced when it exists.
func storeApplies(t *testing.T, e *Engine) {
	t.Helper()
	fake := e.opts.Dynamic.(*dynamicfake.FakeDynamicClient)
	fake.PrependReactor("patch", localGVR.Resource, func(a clienttesting.Action) (bool, runtime.Object, error) {
		if a.(clienttesting.PatchAction).GetPatchType() != types.ApplyPatchType {
			return false, nil, nil // other patches: the fake's own
		}
		u := &unstructured.Unstructured{}
		if err := json.Unmarshal(a.(clienttesting.PatchAction).GetPatch(), &u.Object); err != nil {
			return true, nil, err
		}
		u.SetNamespace(a.GetNamespace())
		err := fake.Tracker().Create(localGVR, u, a.GetNamespace())
		if apierrors.IsAlreadyExists(err) {
			err = fake.Tracker().Update(localGVR, u, a.GetNamespace())
		}
		return true, u, err
	})
}

// TestDeleteOfUnknownCopyIsConfirmed: nothing in the cache and nothing
// applied by this engine means there is no copy.
func TestDeleteOfUnknownCopyIsConfirmed(t *testing.T) {
	key, _ := remoteThing()
	e, _, _ := testEngine(t, true)
	e.Handle(&ferryv1.SyncIntent{Key: key, Version: &ferryv1.ObjectVersion{Sequence: 2}, PublishedResource: "pr",
		Operation: &ferryv1.SyncIntent_Delete{Delete: &ferryv1.DeleteIntent{}}})
	runQueue(t, e)
	got := reportsQueued(e)
	if len(got) != 1 || got[0].GetDeletionConfirmation() == nil || got[0].GetDeletionConfirmation().GetReportId() == 0 {
		t.Fatalf("want one numbered deletion confirmation, got %v", got)
	}
}

// TestNotReadyIsAnsweredAtOnce: a resource whose local watch has not
// listed answers with a retryable NOT_READY nack instead of holding the
// intent (which filled the broker's shared window and stalled every
// resource).
func TestNotReadyIsAnsweredAtOnce(t *testing.T) {
	key, _ := remoteThing()
	e, _, sink := testEngine(t, false) // listing the local copies is forbidden
	e.Handle(&ferryv1.SyncIntent{Key: key, Version: &ferryv1.ObjectVersion{Sequence: 1}, PublishedResource: "pr",
		Operation: &ferryv1.SyncIntent_Upsert{Upsert: &ferryv1.UpsertIntent{Object: []byte(`{}`)}}})
	runQueue(t, e)
	if len(sink.msgs) != 1 {
		t.Fatalf("want one answer, got %d", len(sink.msgs))
	}
	ae := sink.msgs[0].GetIntentResult().GetError()
	if ae.GetReason() != ferryv1.ApplyErrorReason_APPLY_ERROR_REASON_NOT_READY || !ae.GetRetryable() {
		t.Fatalf("want a retryable NOT_READY nack, got %v", ae)
	}
	if want := errListForbidden.Error(); !contains(ae.GetMessage(), want) {
		t.Fatalf("nack %q does not say why (%q)", ae.GetMessage(), want)
	}
}

// TestReportsSurviveReconnect: a report not answered on one stream is sent
// again on the next, with the same id, and an answer removes it.
func TestReportsSurviveReconnect(t *testing.T) {
	e, _, _ := testEngine(t, true)
	key, _ := remoteThing()
	e.report(reportKey{kind: reportStatus, object: keyFor("pr", key)}, &ferryv1.ConnectRequest{Message: &ferryv1.ConnectRequest_StatusReport{StatusReport: &ferryv1.StatusReport{Key: key, Status: []byte(`{}`)}}})
	first := reportsQueued(e)
	if len(first) != 1 {
		t.Fatalf("want 1 report, got %d", len(first))
	}
	e.Detach()
	e.Attach(&recordingSink{})
	again := reportsQueued(e)
	if len(again) != 1 || again[0].GetStatusReport().GetReportId() != first[0].GetStatusReport().GetReportId() {
		t.Fatalf("unanswered report not re-sent with its id: %v", again)
	}
	e.ReportResult(&ferryv1.ReportResult{ReportId: again[0].GetStatusReport().GetReportId()})
	e.Detach()
	e.Attach(&recordingSink{})
	if left := reportsQueued(e); len(left) != 0 {
		t.Fatalf("answered report sent again: %v", left)
	}
}

var (
	errListForbidden = forbidden("things.svc.example is forbidden: cannot list")
	getOpts          = metav1.GetOptions{}
)

type forbidden string

func (f forbidden) Error() string { return string(f) }

func contains(s, sub string) bool { return strings.Contains(s, sub) }

// TestDriftOfCopiesFromAnEarlierProcess: after a restart the edge holds no
// desired state for copies an earlier process applied (the broker sends
// nothing for unchanged ones), so it asks the broker for it when someone
// else deletes such a copy or changes its spec; its own applies and status
// writes ask for nothing.
func TestDriftOfCopiesFromAnEarlierProcess(t *testing.T) {
	withHash := func(u *unstructured.Unstructured, hash string, generation int64) *unstructured.Unstructured {
		u = u.DeepCopy()
		ann := u.GetAnnotations()
		ann[naming.AnnotationContentHash] = hash
		u.SetAnnotations(ann)
		u.SetGeneration(generation)
		return u
	}
	withContent := func(u *unstructured.Unstructured, x string) *unstructured.Unstructured {
		u = u.DeepCopy()
		u.Object["data"] = map[string]any{"x": x}
		return u
	}
	withLabel := func(u *unstructured.Unstructured, k, v string) *unstructured.Unstructured {
		u = u.DeepCopy()
		l := u.GetLabels()
		l[k] = v
		u.SetLabels(l)
		return u
	}
	_, remote := remoteThing()
	base := localCopy(remote)
	for _, tc := range []struct {
		name     string
		old, obj *unstructured.Unstructured // old nil: obj deleted
		want     string                     // ResendRequest reason, "" for none
	}{
		{name: "deleted by someone else", obj: withHash(base, "h1", 1), want: "deleted"},
		{name: "spec changed by someone else", old: withHash(base, "h1", 1), obj: withHash(base, "h1", 2), want: "changed"},
		{name: "status or metadata written", old: withHash(base, "h1", 1), obj: withHash(base, "h1", 1)},
		{name: "this edge applied a new state", old: withHash(base, "h1", 1), obj: withHash(base, "h2", 2)},
		// Kinds whose API server keeps no generation (ConfigMap, Role)
		// are judged by their content.
		{name: "content of a kind without generation changed by someone else", old: withContent(withHash(base, "h1", 0), "a"), obj: withContent(withHash(base, "h1", 0), "b"), want: "changed"},
		{name: "metadata of a kind without generation written", old: withContent(withHash(base, "h1", 0), "a"), obj: withLabel(withContent(withHash(base, "h1", 0), "a"), "team", "red")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, w, _ := testEngine(t, true)
			if tc.old == nil {
				e.localGone(w, tc.obj)
			} else {
				e.localChanged(w, tc.old, tc.obj)
			}
			runQueue(t, e)
			var got []string
			for _, m := range reportsQueued(e) {
				if r := m.GetResendRequest(); r != nil {
					got = append(got, r.GetReason())
				}
			}
			if tc.want == "" && len(got) != 0 || tc.want != "" && (len(got) != 1 || got[0] != tc.want) {
				t.Fatalf("resend requests %v, want %q", got, tc.want)
			}
			for _, a := range e.opts.Dynamic.(*dynamicfake.FakeDynamicClient).Actions() {
				if a.GetVerb() == "patch" {
					t.Fatal("a copy this engine did not apply was repaired from memory")
				}
			}
		})
	}
}

// TestResentStateIsAppliedOverADriftedCopy: the state the broker re-sends
// after a ResendRequest is applied even though the drifted copy still
// carries its content hash (a hand edit does not change the annotation).
func TestResentStateIsAppliedOverADriftedCopy(t *testing.T) {
	key, remote := remoteThing()
	drifted := localCopy(remote)
	ann := drifted.GetAnnotations()
	ann[naming.AnnotationContentHash] = "h1"
	drifted.SetAnnotations(ann)
	drifted.SetGeneration(2)
	e, w, sink := testEngine(t, true, drifted)
	old := drifted.DeepCopy()
	old.SetGeneration(1)
	e.localChanged(w, old, drifted)

	e.Handle(&ferryv1.SyncIntent{Key: key, Version: &ferryv1.ObjectVersion{Sequence: 3}, PublishedResource: "pr",
		Operation: &ferryv1.SyncIntent_Upsert{Upsert: &ferryv1.UpsertIntent{ContentHash: "h1",
			Object: []byte(`{"apiVersion":"kcp.example/v1","kind":"Thing","metadata":{"name":"a","namespace":"team"},"spec":{"x":"desired"}}`)}}})
	runQueue(t, e)
	if len(sink.msgs) != 1 || sink.msgs[0].GetIntentResult() == nil {
		t.Fatalf("want one intent result, got %v", sink.msgs)
	}
	// The fake client cannot server-side apply unstructured objects; the
	// apply being sent is what this test is about.
	fake := e.opts.Dynamic.(*dynamicfake.FakeDynamicClient)
	patched := false
	for _, a := range fake.Actions() {
		if a.GetVerb() == "patch" {
			patched = true
		}
	}
	if !patched {
		t.Fatalf("the re-sent state was not applied over the drifted copy (answer %v)", sink.msgs[0].GetIntentResult())
	}
}

// TestRefusalsAreFinal: what retrying cannot fix is nacked as final (the
// broker then waits for a change instead of retrying every few minutes).
func TestRefusalsAreFinal(t *testing.T) {
	gr := schema.GroupResource{Group: "svc.example", Resource: "things"}
	cases := []struct {
		err  error
		want bool
	}{
		{apierrors.NewInvalid(schema.GroupKind{Group: "svc.example", Kind: "Thing"}, "a", nil), false},
		{apierrors.NewForbidden(gr, "a", nil), false},
		{apierrors.NewBadRequest("bad"), false},
		{apierrors.NewConflict(gr, "a", nil), true},
		{apierrors.NewServiceUnavailable("down"), true},
		{apierrors.NewTimeoutError("slow", 1), true},
	}
	for _, tc := range cases {
		if got := retryable(tc.err); got != tc.want {
			t.Errorf("retryable(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}

// TestRenamedAgentDeletesItsOldCopies: a copy made under an earlier agent
// name is not in this edge's watch (it selects by agent label), so a
// delete used to be confirmed at once and the copy was left behind. It is
// found where the naming rules put it, deleted, and only then confirmed.
func TestRenamedAgentDeletesItsOldCopies(t *testing.T) {
	key, remote := remoteThing()
	rules, err := naming.Compile(nil)
	if err != nil {
		t.Fatal(err)
	}
	ns, name, err := rules.Local(remote, true)
	if err != nil {
		t.Fatal(err)
	}
	old := localCopy(remote)
	old.SetNamespace(ns)
	old.SetName(name)
	old.SetLabels(objects.MergeStrings(naming.Labels("old-name", remote), naming.OwnerLabels(remoteGVR.GroupResource(), "pr")))
	e, _, sink := testEngine(t, true, old)
	e.Handle(&ferryv1.SyncIntent{Key: key, Version: &ferryv1.ObjectVersion{Sequence: 2}, PublishedResource: "pr",
		Operation: &ferryv1.SyncIntent_Delete{Delete: &ferryv1.DeleteIntent{}}})
	runQueue(t, e)
	if len(sink.msgs) != 1 || sink.msgs[0].GetIntentResult().GetError() != nil {
		t.Fatalf("want one ack, got %v", sink.msgs)
	}
	if _, err := e.opts.Dynamic.Resource(localGVR).Namespace(ns).Get(context.Background(), name, getOpts); !apierrors.IsNotFound(err) {
		t.Fatalf("the copy of the earlier agent name is still there: %v", err)
	}
	got := reportsQueued(e)
	if len(got) != 1 || got[0].GetDeletionConfirmation() == nil {
		t.Fatalf("want a deletion confirmation after the delete, got %v", got)
	}
}

// TestNotReadyRelatedIntentIsMatchable: a related intent answered "not
// ready" before it reached applyRelated went back without related_to, so
// the broker could not match the answer: the intent stayed in flight and
// was never retried (a kcp-origin Secret never reached the service
// cluster).
func TestNotReadyRelatedIntentIsMatchable(t *testing.T) {
	key, _ := remoteThing()
	e, _, sink := testEngineWith(t, engineSetup{namespacesForbidden: true}) // not ready
	rt := &ferryv1.RelatedTo{Primary: key, Identifier: "creds"}
	e.Handle(&ferryv1.SyncIntent{Key: &ferryv1.ObjectKey{Cluster: "c1", Namespace: "team", Name: "creds"}, PublishedResource: "pr",
		RelatedTo: rt, Version: &ferryv1.ObjectVersion{Sequence: 3},
		Operation: &ferryv1.SyncIntent_Upsert{Upsert: &ferryv1.UpsertIntent{Object: []byte(`{}`)}}})
	runQueue(t, e)
	if len(sink.msgs) != 1 {
		t.Fatalf("want one answer, got %v", sink.msgs)
	}
	res := sink.msgs[0].GetIntentResult()
	if res.GetError().GetReason() != ferryv1.ApplyErrorReason_APPLY_ERROR_REASON_NOT_READY || !proto.Equal(res.GetRelatedTo(), rt) {
		t.Fatalf("answer %v: want NOT_READY carrying related_to %v", res, rt)
	}
}
