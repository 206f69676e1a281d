package replication

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/tools/cache"

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
		Reference: ferryv1alpha1.RelatedResourceReference{Name: ferryv1alpha1.ResourceLocator{Path: "spec.secretName"}},
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
			secret := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "Secret"}}
			secret.SetNamespace("local-ns")
			secret.SetName("creds")
			secret.SetLabels(map[string]string{naming.LabelAgent: "nora", naming.LabelRelatedTo: primary.GetAnnotations()[naming.AnnotationUID],
				naming.LabelRelatedIdentifier: "creds"})
			e, _, _ := testEngineWith(t, engineSetup{related: []Related{{Reference: refs[0], Local: secretsGVR}}}, primary)
			_ = reportsQueued(e) // what listing reported

			// The related watch saw the Secret go.
			e.mu.Lock()
			rw := e.relWatches[secretsGVR]
			e.mu.Unlock()
			e.relatedGone(rw, cache.DeletedFinalStateUnknown{Key: "local-ns/creds", Obj: secret})
			reports := reportsQueued(e)
			var asked []string
			for _, m := range reports {
				if r := m.GetResendRequest(); r != nil {
					if r.GetRelatedTo().GetIdentifier() != "creds" || r.GetRelatedTo().GetPrimary().GetUid() != primary.GetAnnotations()[naming.AnnotationUID] {
						t.Fatalf("resend request %v does not name the related entry of the primary", r)
					}
					asked = append(asked, r.GetReason())
				}
			}
			if tc.want != (len(asked) == 1) {
				t.Fatalf("resend requests %v, want one: %v", asked, tc.want)
			}
		})
	}
}

func metav1Now() metav1.Time { return metav1.Now() }
