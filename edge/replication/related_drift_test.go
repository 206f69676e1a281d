package replication

import (
	"context"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"

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
		Reference: &ferryv1alpha1.RelatedResourceReference{Name: ferryv1alpha1.ResourceLocator{Path: "spec.secretName"}},
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
			primary := primaryIn("c1", "local-ns", "a-copy", "creds")
			// A second primary whose copy is replaced: its resend request
			// shows the related watch handled every event before it.
			marker := primaryIn("c1", "local-ns", "b-copy", "creds-b")
			e, _, _ := testEngineWith(t, engineSetup{related: []Related{kcpCredsRef(t)}}, primary, marker)
			_ = reportsQueued(e) // what listing reported
			u := relatedCopy("nora", primary)
			tc.edit(u)
			markerCopy := relatedCopy("nora", marker)
			markerCopy.SetName("creds-b")
			markerCopy.SetManagedFields(nil)
			secrets := e.opts.Dynamic.Resource(secretsGVR).Namespace("local-ns")
			for _, s := range []*unstructured.Unstructured{u, markerCopy} {
				if _, err := secrets.Create(context.Background(), s, metav1.CreateOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			asked := resendsBefore(t, e, primary, marker)
			if tc.want != (len(asked) == 1) || (tc.want && asked[0] != "changed") {
				t.Fatalf("resend requests %q, want one (reason changed): %v", asked, tc.want)
			}
			e.mu.Lock()
			cached, ok := e.relWatches[secretsGVR].get("local-ns", "creds")
			e.mu.Unlock()
			if !ok {
				t.Fatal("the related cache does not hold the copy")
			}
			if mf := cached.GetManagedFields(); mf != nil {
				t.Fatalf("the cache keeps managedFields: %v", mf)
			}
		})
	}
}

// TestRelatedCopyEditedInTheClusterIsAskedForAgain runs the same through
// the edge's real related watch: an edit someone makes to a copy in the
// service cluster reaches the broker as a resend request.
func TestRelatedCopyEditedInTheClusterIsAskedForAgain(t *testing.T) {
	primary := primaryIn("c1", "local-ns", "a-copy", "creds")
	secret := relatedCopy("nora", primary)
	e, _, _ := testEngineWith(t, engineSetup{related: []Related{kcpCredsRef(t)}, relatedClusterWide: true}, primary, secret)
	ctx := context.Background()
	dyn := e.opts.Dynamic
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
	waitFor(t, func() (bool, string) {
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

// resendsBefore returns the reasons of the resend requests for primary's
// related entry creds, up to the first one for marker's: the related
// watch's events are handled in order, so marker's copy changing last
// shows every earlier event was handled.
func resendsBefore(t *testing.T, e *Engine, primary, marker *unstructured.Unstructured) []string {
	t.Helper()
	var asked []string
	waitFor(t, func() (bool, string) {
		for _, m := range reportsQueued(e) {
			r := m.GetResendRequest()
			if r == nil {
				continue
			}
			switch r.GetRelatedTo().GetPrimary().GetUid() {
			case marker.GetAnnotations()[naming.AnnotationUID]:
				return true, ""
			case primary.GetAnnotations()[naming.AnnotationUID]:
				if r.GetRelatedTo().GetIdentifier() != "creds" {
					t.Fatalf("resend request %v does not name the related entry of the primary", r)
				}
				asked = append(asked, r.GetReason())
			default:
				t.Fatalf("resend request %v does not name the related entry of the primary", r)
			}
		}
		return false, "no resend request for the marker's copy yet"
	})
	return asked
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
			primary := primaryIn("c1", "local-ns", "a-copy", "creds")
			u := relatedCopy("nora", primary)
			u.SetAnnotations(objects.MergeStrings(u.GetAnnotations(), map[string]string{naming.AnnotationResourceVersion: "7"}))
			tc.edit(u)
			e, w, sink := testEngineWith(t, engineSetup{related: []Related{kcpCredsRef(t)}}, primary, u)
			acceptApplies(e)
			remote, _ := naming.RemoteFrom(primary.GetLabels(), primary.GetAnnotations())
			pk := remoteKey(w.pub, remote)
			e.Handle(&ferryv1.SyncIntent{Key: &ferryv1.ObjectKey{Cluster: "c1", Namespace: "default", Name: "creds", Uid: "u-s"}, PublishedResource: "pr",
				RelatedTo: &ferryv1.RelatedTo{Primary: pk, Identifier: "creds"}, Version: &ferryv1.ObjectVersion{Sequence: 1, ResourceVersion: "7"},
				Operation: &ferryv1.SyncIntent_Upsert{Upsert: &ferryv1.UpsertIntent{Object: []byte(content)}}})
			runQueue(t, e)
			if answers := relatedAnswers(sink); len(answers) != 1 || answers[0].GetError() != nil {
				t.Fatalf("apply: answers %v, want one success", answers)
			}
			got := secretPatches(t, e)
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
			primary := primaryIn("c1", "local-ns", "a-copy", "creds")
			u := relatedCopy("nora", primary)
			u.SetAnnotations(objects.MergeStrings(u.GetAnnotations(), naming.Annotations(naming.Remote{Namespace: "default", Name: "creds", UID: "u-s"})))
			tc.edit(u)
			setup := engineSetup{related: []Related{kcpCredsRef(t)}}
			objs := []runtime.Object{primary, u}
			if tc.unsynced {
				// Another namespace of this agent's whose related cache
				// cannot list.
				setup.relatedListForbiddenIn = "ws-b"
				objs = append(objs, ferryNamespace("ws-b", "b"))
			}
			e, _, _ := testEngineWith(t, setup, objs...)
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
