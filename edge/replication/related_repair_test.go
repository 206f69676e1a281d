package replication

import (
	"context"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
	ferryv1alpha1 "github.com/ferry-dev/ferry/api/v1alpha1"
	"github.com/ferry-dev/ferry/pkg/naming"
	"github.com/ferry-dev/ferry/pkg/related"
)

// TestDeletedRelatedCopyIsAskedForAgain: a copy of a kcp-origin related
// object (a Secret the consumer wrote in kcp) deleted in the service cluster
// by someone else used to stay deleted until the object changed in kcp. The
// edge now asks the broker for it again (a ResendRequest naming the related
// entry); its own deletions (the primary is being deleted) ask for nothing.
func TestDeletedRelatedCopyIsAskedForAgain(t *testing.T) {
	refs, err := related.Compile([]ferryv1alpha1.RelatedResourceSpec{{
		Identifier: "creds", Origin: ferryv1alpha1.OriginKCP, Kind: "Secret",
		Reference: &ferryv1alpha1.RelatedResourceReference{Name: ferryv1alpha1.ResourceLocator{Path: "spec.secretName"}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name            string
		primaryDeleting bool
		want            bool
	}{
		{name: "deleted by someone else", want: true},
		{name: "deleted along with its primary", primaryDeleting: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			primary := primaryIn("c1", "local-ns", "a-copy", "creds")
			if tc.primaryDeleting {
				now := metav1Now()
				primary.SetDeletionTimestamp(&now)
				primary.SetFinalizers([]string{"example.com/cleanup"})
			}
			secret := relatedSecret(primary, "creds")
			// A second primary whose copy someone else deletes after: its
			// resend request shows the related watch handled the first
			// deletion.
			marker := primaryIn("c1", "local-ns", "b-copy", "creds-b")
			markerSecret := relatedSecret(marker, "creds-b")
			e, _, _ := testEngineWith(t, engineSetup{related: []Related{{Reference: refs[0], Local: secretsGVR}}}, primary, secret, marker, markerSecret)
			_ = reportsQueued(e) // what listing reported

			secrets := e.opts.Dynamic.Resource(secretsGVR).Namespace("local-ns")
			for _, name := range []string{"creds", "creds-b"} {
				if err := secrets.Delete(context.Background(), name, metav1.DeleteOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			asked := resendsBefore(t, e, primary, marker)
			if tc.want != (len(asked) == 1) {
				t.Fatalf("resend requests %v, want one: %v", asked, tc.want)
			}
		})
	}
}

func metav1Now() metav1.Time { return metav1.Now() }

// relatedSecret is this agent's copy ns/name of primary's related entry
// creds.
func relatedSecret(primary *unstructured.Unstructured, name string) *unstructured.Unstructured {
	secret := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "Secret"}}
	secret.SetNamespace(primary.GetNamespace())
	secret.SetName(name)
	secret.SetLabels(map[string]string{naming.LabelAgent: "nora", naming.LabelRelatedTo: primary.GetAnnotations()[naming.AnnotationUID],
		naming.LabelRelatedIdentifier: "creds"})
	return secret
}

// TestRelatedCleanupOnTheEdge: before a primary copy is deleted, the
// kcp-origin related copies ferry wrote for it are deleted by default;
// with cleanup: false they stay, released: no ferry.dev/ label or
// annotation is left, so nothing of ferry's finds them again.
func TestRelatedCleanupOnTheEdge(t *testing.T) {
	no := false
	for _, tc := range []struct {
		name    string
		cleanup *bool
		kept    bool
	}{
		{name: "default"},
		{name: "cleanup false", cleanup: &no, kept: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			refs, err := related.Compile([]ferryv1alpha1.RelatedResourceSpec{{
				Identifier: "creds", Origin: ferryv1alpha1.OriginKCP, Kind: "Secret", Cleanup: tc.cleanup,
				Reference: &ferryv1alpha1.RelatedResourceReference{Name: ferryv1alpha1.ResourceLocator{Path: "spec.secretName"}},
			}})
			if err != nil {
				t.Fatal(err)
			}
			primary := primaryIn("c1", "local-ns", "a-copy", "creds")
			secret := relatedSecret(primary, "creds")
			secret.SetAnnotations(map[string]string{naming.AnnotationContentHash: "h", "note": "theirs"})
			e, w, _ := testEngineWith(t, engineSetup{related: []Related{{Reference: refs[0], Local: secretsGVR}}}, primary, secret)
			uid := primary.GetAnnotations()[naming.AnnotationUID]
			waitFor(t, func() (bool, string) {
				e.mu.Lock()
				rw := e.relWatches[secretsGVR]
				e.mu.Unlock()
				return rw != nil && len(rw.owned(relatedOwnerKey(uid, "creds"))) == 1, "the copy is not cached"
			})
			if err := e.deleteRelatedCopies(context.Background(), w.pub, uid, false); err != nil {
				t.Fatal(err)
			}
			got, err := e.opts.Dynamic.Resource(secretsGVR).Namespace("local-ns").Get(context.Background(), "creds", metav1.GetOptions{})
			if !tc.kept {
				if err == nil {
					t.Fatal("the copy outlived its primary")
				}
				return
			}
			if err != nil {
				t.Fatalf("the copy was deleted: %v", err)
			}
			for k := range got.GetLabels() {
				t.Errorf("label %s left on the released copy", k)
			}
			if ann := got.GetAnnotations(); len(ann) != 1 || ann["note"] != "theirs" {
				t.Errorf("annotations of the released copy: %v, want only note", ann)
			}
		})
	}
}

// TestOrphanedPrimaryKeepsItsRelatedCopies: a primary copy orphaned (the
// consumer's deletion policy Orphan) stays in the service cluster, and so do
// the kcp-origin related copies it uses (a credentials Secret of a kept
// database), released like those of cleanup: false: with ferry's labels
// left on them, a later deletion of the related object in kcp would delete
// the copy the orphan still uses.
func TestOrphanedPrimaryKeepsItsRelatedCopies(t *testing.T) {
	refs, err := related.Compile([]ferryv1alpha1.RelatedResourceSpec{{
		Identifier: "creds", Origin: ferryv1alpha1.OriginKCP, Kind: "Secret",
		Reference: &ferryv1alpha1.RelatedResourceReference{Name: ferryv1alpha1.ResourceLocator{Path: "spec.secretName"}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	for _, orphan := range []bool{true, false} {
		t.Run(map[bool]string{true: "orphan", false: "delete"}[orphan], func(t *testing.T) {
			primary := primaryIn("c1", "local-ns", "a-copy", "creds")
			secret := relatedSecret(primary, "creds")
			e, _, sink := testEngineWith(t, engineSetup{related: []Related{{Reference: refs[0], Local: secretsGVR}}}, primary, secret)
			uid := primary.GetAnnotations()[naming.AnnotationUID]
			waitFor(t, func() (bool, string) {
				e.mu.Lock()
				rw := e.relWatches[secretsGVR]
				e.mu.Unlock()
				return rw != nil && len(rw.owned(relatedOwnerKey(uid, "creds"))) == 1 && e.CopyOf("pr", "c1", "default", "app") != nil,
					"the copies are not cached"
			})
			key := &ferryv1.ObjectKey{Cluster: "c1", Resource: &ferryv1.GroupVersionResource{Group: remoteGVR.Group, Version: "v1", Resource: "things"},
				Namespace: "default", Name: "app", Uid: uid}
			e.Handle(&ferryv1.SyncIntent{Key: key, Version: &ferryv1.ObjectVersion{Sequence: 1}, PublishedResource: "pr",
				Operation: &ferryv1.SyncIntent_Delete{Delete: &ferryv1.DeleteIntent{Orphan: orphan}}})
			runQueue(t, e)
			if err := sink.msgs[len(sink.msgs)-1].GetIntentResult().GetError(); err != nil {
				t.Fatal(err)
			}
			got, err := e.opts.Dynamic.Resource(secretsGVR).Namespace("local-ns").Get(context.Background(), "creds", metav1.GetOptions{})
			if !orphan {
				if err == nil {
					t.Fatal("the related copy outlived its deleted primary")
				}
				return
			}
			if err != nil {
				t.Fatalf("the related copy of an orphaned primary was deleted: %v", err)
			}
			for k := range got.GetLabels() {
				t.Errorf("label %s left on the related copy of an orphaned primary", k)
			}
		})
	}
}
