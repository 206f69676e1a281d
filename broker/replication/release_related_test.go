package replication

import (
	"context"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
	ferryv1alpha1 "github.com/ferry-dev/ferry/api/v1alpha1"
	"github.com/ferry-dev/ferry/pkg/naming"
	"github.com/ferry-dev/ferry/pkg/related"
)

// TestReleaseNeverDeletesALiveObjectsRelatedCopies: a deletion
// confirmation for a name whose cached object has another UID (the edge
// named a live object's UID with another name) deletes none of the related
// copies in kcp that carry that UID: they belong to the live object.
func TestReleaseNeverDeletesALiveObjectsRelatedCopies(t *testing.T) {
	refs, err := related.Compile([]ferryv1alpha1.RelatedResourceSpec{{
		Identifier: "tls", Origin: ferryv1alpha1.OriginService, Kind: "Secret",
		Reference: &ferryv1alpha1.RelatedResourceReference{Name: ferryv1alpha1.ResourceLocator{Path: "spec.secretName"}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	live := thing("1", map[string]any{"secretName": "s"}, nil) // default/a, u-a
	secret := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "Secret",
		"metadata": map[string]any{"name": "s", "namespace": "ns", "uid": "u-s",
			"labels":      map[string]any{naming.LabelRelatedTo: "u-a", naming.LabelRelatedIdentifier: "tls"},
			"annotations": map[string]any{"kcp.io/cluster": "c"}}}}
	res := thingsResource()
	res.Related = refs
	e := newEnv(t, res, live, secret)
	m, client := e.m, e.kcp
	deletes := func() (n int) {
		for _, a := range client.Actions() {
			if a.GetVerb() == "delete" {
				n++
			}
		}
		return n
	}
	// The live object's UID under another name.
	forged := &ferryv1.ObjectKey{Cluster: "c", Resource: thingKey().GetResource(), Namespace: "ns", Name: "b", Uid: "u-a"}
	err = m.Release(context.Background(), "pr", forged)
	t.Logf("release: %v", err)
	if n := deletes(); n != 0 {
		t.Fatalf("%d related copies of the live object were deleted", n)
	}
	// Control: the live object's own key reaches the copy (the test can
	// fail): the edge reports its related object gone, and the copy goes.
	if err := m.WriteRelated(context.Background(), "pr", &ferryv1.RelatedObjectReport{
		RelatedTo: &ferryv1.RelatedTo{Primary: thingKey(), Identifier: "tls"},
		State:     &ferryv1.RelatedObjectReport_Gone{Gone: &ferryv1.RelatedObjectGone{}},
	}); err != nil {
		t.Fatal(err)
	}
	if n := deletes(); n != 1 {
		t.Fatalf("control: the related copy is not found by its primary's key: %d deletes", n)
	}
}
