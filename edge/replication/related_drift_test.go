package replication

import (
	"context"
	"testing"
	"time"

	"github.com/go-logr/logr"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	clientfeatures "k8s.io/client-go/features"
	clientfeaturestesting "k8s.io/client-go/features/testing"
	kubefake "k8s.io/client-go/kubernetes/fake"
	"k8s.io/client-go/tools/cache"

	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
	ferryv1alpha1 "github.com/ferry-dev/ferry/api/v1alpha1"
	"github.com/ferry-dev/ferry/pkg/naming"
	"github.com/ferry-dev/ferry/pkg/objects"
	"github.com/ferry-dev/ferry/pkg/related"
)

// kcpCredsRef is a kcp-origin related entry: the Secret spec.secretName
// names.
func kcpCredsRef(t *testing.T) Related {
	t.Helper()
	refs, err := related.Compile([]ferryv1alpha1.RelatedResourceSpec{{
		Identifier: "creds", Origin: ferryv1alpha1.OriginKCP, Kind: "Secret",
		Reference: ferryv1alpha1.RelatedResourceReference{Name: ferryv1alpha1.ResourceLocator{Path: "spec.secretName"}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	return Related{Reference: refs[0], Local: secretsGVR}
}

// ferrysSecretFields is what ferry's field manager owns on a related copy
// of a Secret with data.password, label kind and type.
const ferrysSecretFields = `{"f:data":{"f:password":{}},"f:metadata":{"f:annotations":{"f:ferry.dev/content-hash":{}},` +
	`"f:labels":{"f:ferry.dev/agent":{},"f:ferry.dev/related-identifier":{},"f:ferry.dev/related-to":{},"f:kind":{}}},"f:type":{}}`

// relatedCopy is agent's copy in local-ns of the kcp Secret creds of
// primary, as the API server holds it after ferry applied it: data, label
// and type owned by ferry's field manager, the applied content's hash in
// its annotation.
func relatedCopy(agent string, primary *unstructured.Unstructured) *unstructured.Unstructured {
	content := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "Secret",
		"metadata": map[string]any{"labels": map[string]any{"kind": "db"}},
		"data":     map[string]any{"password": "aHVudGVyMg=="}, "type": "Opaque"}}
	u := content.DeepCopy()
	u.SetNamespace("local-ns")
	u.SetName("creds")
	u.SetUID("u-copy")
	u.SetResourceVersion("1")
	u.SetLabels(map[string]string{"kind": "db", naming.LabelAgent: agent,
		naming.LabelRelatedTo: primary.GetAnnotations()[naming.AnnotationUID], naming.LabelRelatedIdentifier: "creds"})
	u.SetAnnotations(map[string]string{naming.AnnotationContentHash: objects.RelatedHash(content)})
	u.SetManagedFields([]metav1.ManagedFieldsEntry{{Manager: FieldManager, Operation: metav1.ManagedFieldsOperationApply,
		APIVersion: "v1", FieldsType: "FieldsV1", FieldsV1: &metav1.FieldsV1{Raw: []byte(ferrysSecretFields)}}})
	return u
}

// takenOver moves u's field data.password from ferry's field manager to
// someone else's, as an update that changed it does.
func takenOver(u *unstructured.Unstructured, fields string) {
	u.SetManagedFields([]metav1.ManagedFieldsEntry{
		{Manager: FieldManager, Operation: metav1.ManagedFieldsOperationApply, APIVersion: "v1", FieldsType: "FieldsV1",
			FieldsV1: &metav1.FieldsV1{Raw: []byte(fields)}},
		{Manager: "kubectl-edit", Operation: metav1.ManagedFieldsOperationUpdate, APIVersion: "v1", FieldsType: "FieldsV1",
			FieldsV1: &metav1.FieldsV1{Raw: []byte(`{"f:data":{"f:password":{}}}`)}},
	})
}

// withoutPassword is ferrysSecretFields after someone else took
// data.password over.
const withoutPassword = `{"f:metadata":{"f:annotations":{"f:ferry.dev/content-hash":{}},` +
	`"f:labels":{"f:ferry.dev/agent":{},"f:ferry.dev/related-identifier":{},"f:ferry.dev/related-to":{},"f:kind":{}}},"f:type":{}}`

// TestEditedRelatedCopyIsAskedForAgain: a copy of a kcp-origin related
// object edited in the service cluster in fields ferry wrote used to stay
// edited until the object changed in kcp. The edge notices it from the
// fields its field manager owns (no content kept in memory) and asks the
// broker for the object again; fields other managers added are theirs and
// are no reason to.
func TestEditedRelatedCopyIsAskedForAgain(t *testing.T) {
	for _, tc := range []struct {
		name string
		edit func(u *unstructured.Unstructured)
		want bool
	}{
		{name: "unchanged", edit: func(*unstructured.Unstructured) {}},
		{name: "a key added by another manager", edit: func(u *unstructured.Unstructured) {
			u.Object["data"] = map[string]any{"password": "aHVudGVyMg==", "extra": "eA=="}
			u.SetManagedFields(append(u.GetManagedFields(), metav1.ManagedFieldsEntry{Manager: "other", Operation: metav1.ManagedFieldsOperationApply,
				APIVersion: "v1", FieldsType: "FieldsV1", FieldsV1: &metav1.FieldsV1{Raw: []byte(`{"f:data":{"f:extra":{}}}`)}}))
		}},
		{name: "a label added by another manager", edit: func(u *unstructured.Unstructured) {
			u.SetLabels(objects.MergeStrings(u.GetLabels(), map[string]string{"team": "db"}))
		}},
		{name: "data changed by someone else", want: true, edit: func(u *unstructured.Unstructured) {
			u.Object["data"] = map[string]any{"password": "dGFtcGVyZWQ="}
			takenOver(u, withoutPassword)
		}},
		{name: "data removed by someone else", want: true, edit: func(u *unstructured.Unstructured) {
			delete(u.Object, "data")
			takenOver(u, withoutPassword)
		}},
		{name: "data changed, ferry's ownership left as it was", want: true, edit: func(u *unstructured.Unstructured) {
			u.Object["data"] = map[string]any{"password": "dGFtcGVyZWQ="}
		}},
		{name: "ferry's managed fields gone (replaced)", want: true, edit: func(u *unstructured.Unstructured) {
			u.SetManagedFields(nil)
		}},
		{name: "written before content hashes", edit: func(u *unstructured.Unstructured) {
			u.Object["data"] = map[string]any{"password": "dGFtcGVyZWQ="}
			takenOver(u, withoutPassword)
			u.SetAnnotations(nil)
		}},
		{name: "another agent's copy", edit: func(u *unstructured.Unstructured) {
			u.Object["data"] = map[string]any{"password": "dGFtcGVyZWQ="}
			takenOver(u, withoutPassword)
			u.SetLabels(objects.MergeStrings(u.GetLabels(), map[string]string{naming.LabelAgent: "someone"}))
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, w, _ := testEngine(t, true)
			w.pub.Related = []Related{kcpCredsRef(t)}
			rw := &relatedWatch{gvr: secretsGVR, spaces: map[string]*relatedSpace{}}
			primary := primaryIn("c1", "local-ns", "a-copy", "creds")
			if err := w.store.Add(primary); err != nil {
				t.Fatal(err)
			}
			u := relatedCopy("nora", primary)
			tc.edit(u)
			cached, err := e.relatedTransform(u)
			if err != nil {
				t.Fatal(err)
			}
			if mf := cached.(*unstructured.Unstructured).GetManagedFields(); mf != nil {
				t.Fatalf("the cache keeps managedFields: %v", mf)
			}
			e.relatedUpdated(rw, cached)
			var asked []string
			for _, m := range reportsQueued(e) {
				if r := m.GetResendRequest(); r != nil {
					if r.GetRelatedTo().GetIdentifier() != "creds" || r.GetRelatedTo().GetPrimary().GetUid() != primary.GetAnnotations()[naming.AnnotationUID] {
						t.Fatalf("resend request %v does not name the related entry of the primary", r)
					}
					asked = append(asked, r.GetReason())
				}
			}
			if tc.want != (len(asked) == 1) || (tc.want && asked[0] != "changed") {
				t.Fatalf("resend requests %q, want one (reason changed): %v", asked, tc.want)
			}
		})
	}
}

// TestRelatedCopyEditedInTheClusterIsAskedForAgain runs the same through
// the edge's real related watch: an edit someone makes to a copy in the
// service cluster reaches the broker as a resend request.
func TestRelatedCopyEditedInTheClusterIsAskedForAgain(t *testing.T) {
	clientfeaturestesting.SetFeatureDuringTest(t, clientfeatures.WatchListClient, false)
	primary := primaryIn("c1", "local-ns", "a-copy", "creds")
	secret := relatedCopy("nora", primary)
	dyn := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(),
		map[schema.GroupVersionResource]string{localGVR: "ThingList", secretsGVR: "SecretList"}, secret)
	kube := kubefake.NewClientset(&corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "local-ns"}})
	e := NewEngine(Options{Agent: "nora", Dynamic: dyn, Kube: kube, Wake: func() {}, Log: logr.Discard(), RelatedClusterWide: true})
	rules, err := naming.Compile(nil)
	if err != nil {
		t.Fatal(err)
	}
	pub := &Published{Name: "pr", Remote: remoteGVR, Local: localGVR, LocalKind: "Thing", Namespaced: true, Naming: rules,
		Related: []Related{kcpCredsRef(t)}}
	w := &localWatch{pub: pub, cancel: func() {}, synced: true, store: cache.NewIndexer(cache.MetaNamespaceKeyFunc, copyIndexers())}
	if err := w.store.Add(primary); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	e.mu.Lock()
	e.ctx, e.nsSynced = ctx, true
	e.published["pr"], e.watches["pr"] = pub, w
	e.ensureRelatedWatchesLocked()
	rw := e.relWatches[secretsGVR]
	e.mu.Unlock()
	e.Attach(&recordingSink{})
	waitUntil(t, "the related cache lists", func() (bool, string) {
		e.mu.Lock()
		defer e.mu.Unlock()
		return rw.allSynced(), "not synced"
	})
	if reqs := resendReasons(e); len(reqs) != 0 {
		t.Fatalf("an untouched copy was asked for again: %q", reqs)
	}

	edited := secret.DeepCopy()
	edited.Object["data"] = map[string]any{"password": "dGFtcGVyZWQ="}
	edited.SetResourceVersion("2")
	takenOver(edited, withoutPassword)
	if _, err := dyn.Resource(secretsGVR).Namespace("local-ns").Update(ctx, edited, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	var reasons []string
	waitUntil(t, "a resend request for the edited copy", func() (bool, string) {
		reasons = append(reasons, resendReasons(e)...)
		return len(reasons) > 0, "none yet"
	})
	if len(reasons) != 1 || reasons[0] != "changed" {
		t.Fatalf("resend requests %q, want one for a change", reasons)
	}
}

// resendReasons drains the reports and returns the resend requests'
// reasons.
func resendReasons(e *Engine) []string {
	var out []string
	for _, m := range reportsQueued(e) {
		if r := m.GetResendRequest(); r != nil {
			out = append(out, r.GetReason())
		}
	}
	return out
}

// waitUntil waits up to 10 s for cond, failing with its last reason.
func waitUntil(t *testing.T, what string, cond func() (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		ok, why := cond()
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("waiting for %s: %s", what, why)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestResentRelatedIntentRepairsOnlyAnEditedCopy: the broker's answer to a
// resend request is the kcp object's unchanged state. It used to be skipped
// whenever the copy carried the kcp resourceVersion, edited or not; now it
// is applied over a copy whose ferry-owned fields changed (with ferry's
// content hash), and skipped over an intact one.
func TestResentRelatedIntentRepairsOnlyAnEditedCopy(t *testing.T) {
	content := `{"apiVersion":"v1","kind":"Secret","metadata":{"labels":{"kind":"db"}},"data":{"password":"aHVudGVyMg=="},"type":"Opaque"}`
	for _, tc := range []struct {
		name   string
		edit   func(u *unstructured.Unstructured)
		writes int
	}{
		{name: "intact copy", edit: func(*unstructured.Unstructured) {}},
		{name: "edited copy", writes: 1, edit: func(u *unstructured.Unstructured) {
			u.Object["data"] = map[string]any{"password": "dGFtcGVyZWQ="}
			takenOver(u, withoutPassword)
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, w, _ := testEngine(t, true)
			acceptApplies(e)
			w.pub.Related = []Related{kcpCredsRef(t)}
			primary := primaryIn("c1", "local-ns", "a-copy", "creds")
			primary.SetLabels(objects.MergeStrings(primary.GetLabels(), naming.OwnerLabels(remoteGVR.GroupResource(), "pr")))
			if err := w.store.Add(primary); err != nil {
				t.Fatal(err)
			}
			space := &relatedSpace{synced: true, cancel: func() {},
				store: cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{relatedOwnerIndex: indexByRelatedOwner})}
			e.relWatches[secretsGVR] = &relatedWatch{gvr: secretsGVR, spaces: map[string]*relatedSpace{"local-ns": space}}
			u := relatedCopy("nora", primary)
			u.SetAnnotations(objects.MergeStrings(u.GetAnnotations(), map[string]string{naming.AnnotationResourceVersion: "7"}))
			tc.edit(u)
			cached, err := e.relatedTransform(u)
			if err != nil {
				t.Fatal(err)
			}
			if err := space.store.Add(cached); err != nil {
				t.Fatal(err)
			}
			remote, _ := naming.RemoteFrom(primary.GetLabels(), primary.GetAnnotations())
			pk := remoteKey(w.pub, remote)
			in := &ferryv1.SyncIntent{Key: &ferryv1.ObjectKey{Cluster: "c1", Namespace: "default", Name: "creds", Uid: "u-s"}, PublishedResource: "pr",
				RelatedTo: &ferryv1.RelatedTo{Primary: pk, Identifier: "creds"}, Version: &ferryv1.ObjectVersion{ResourceVersion: "7"},
				Operation: &ferryv1.SyncIntent_Upsert{Upsert: &ferryv1.UpsertIntent{Object: []byte(content)}}}
			if res := e.applyRelated(context.Background(), in); res.GetError() != nil {
				t.Fatalf("apply: %v", res.GetError())
			}
			got := patches(t, e)
			if len(got) != tc.writes {
				t.Fatalf("%d writes, want %d", len(got), tc.writes)
			}
			if tc.writes == 0 {
				return
			}
			if d, _, _ := unstructured.NestedString(got[0].Object, "data", "password"); d != "aHVudGVyMg==" {
				t.Errorf("repair wrote password %q", d)
			}
			if h := got[0].GetAnnotations()[naming.AnnotationContentHash]; h != u.GetAnnotations()[naming.AnnotationContentHash] {
				t.Errorf("repair wrote content hash %q, want the applied content's %q", h, u.GetAnnotations()[naming.AnnotationContentHash])
			}
		})
	}
}

// TestInventoryListsRelatedCopies: the inventory lists the kcp-origin
// related copies the edge holds with the hash of the content applied, so
// the broker does not send them again after a reconnect; an edited copy is
// listed without one (sent again), and while a related cache has not
// listed the list is not complete.
func TestInventoryListsRelatedCopies(t *testing.T) {
	for _, tc := range []struct {
		name     string
		edit     func(u *unstructured.Unstructured)
		unsynced bool
		wantHash bool
	}{
		{name: "intact copy", edit: func(*unstructured.Unstructured) {}, wantHash: true},
		{name: "edited copy", edit: func(u *unstructured.Unstructured) {
			u.Object["data"] = map[string]any{"password": "dGFtcGVyZWQ="}
			takenOver(u, withoutPassword)
		}},
		{name: "related cache not listed", edit: func(*unstructured.Unstructured) {}, unsynced: true, wantHash: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e, w, _ := testEngine(t, true)
			w.pub.Related = []Related{kcpCredsRef(t)}
			primary := primaryIn("c1", "local-ns", "a-copy", "creds")
			primary.SetLabels(objects.MergeStrings(primary.GetLabels(), naming.OwnerLabels(remoteGVR.GroupResource(), "pr")))
			if err := w.store.Add(primary); err != nil {
				t.Fatal(err)
			}
			space := &relatedSpace{synced: !tc.unsynced, cancel: func() {},
				store: cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{relatedOwnerIndex: indexByRelatedOwner})}
			e.relWatches[secretsGVR] = &relatedWatch{gvr: secretsGVR, spaces: map[string]*relatedSpace{"local-ns": space}}
			u := relatedCopy("nora", primary)
			u.SetAnnotations(objects.MergeStrings(u.GetAnnotations(), naming.Annotations(naming.Remote{Namespace: "default", Name: "creds", UID: "u-s"})))
			tc.edit(u)
			cached, err := e.relatedTransform(u)
			if err != nil {
				t.Fatal(err)
			}
			if err := space.store.Add(cached); err != nil {
				t.Fatal(err)
			}
			e.Attach(&recordingSink{})
			var got []*ferryv1.RelatedInventoryEntry
			complete := false
			for {
				m, ok := e.Next()
				if !ok {
					break
				}
				if inv := m.GetInventory(); inv != nil {
					got = append(got, inv.GetRelatedEntries()...)
					complete = complete || inv.GetRelatedComplete()
				}
			}
			if len(got) != 1 {
				t.Fatalf("related entries %v, want one", got)
			}
			entry := got[0]
			if k := entry.GetKey(); k.GetCluster() != "c1" || k.GetNamespace() != "default" || k.GetName() != "creds" || k.GetUid() != "u-s" ||
				entry.GetRelatedTo().GetIdentifier() != "creds" || entry.GetRelatedTo().GetPrimary().GetUid() != primary.GetAnnotations()[naming.AnnotationUID] {
				t.Errorf("entry %v does not name the kcp object and the reference", entry)
			}
			if want := u.GetAnnotations()[naming.AnnotationContentHash]; (entry.GetAppliedHash() == want) != tc.wantHash || (!tc.wantHash && entry.GetAppliedHash() != "") {
				t.Errorf("applied hash %q, want the applied content's (%v)", entry.GetAppliedHash(), tc.wantHash)
			}
			if complete == tc.unsynced {
				t.Errorf("related_complete %v with the related cache listed: %v", complete, !tc.unsynced)
			}
		})
	}
}

// newRelatedStore is a related cache's store.
func newRelatedStore() cache.Indexer {
	return cache.NewIndexer(cache.MetaNamespaceKeyFunc, cache.Indexers{relatedOwnerIndex: indexByRelatedOwner})
}
