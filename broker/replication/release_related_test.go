package replication

import (
	"context"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	"k8s.io/client-go/tools/cache"

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
		Reference: ferryv1alpha1.RelatedResourceReference{Name: ferryv1alpha1.ResourceLocator{Path: "spec.secretName"}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	live := thing("1", map[string]any{"secretName": "s"}, nil) // default/a, u-a
	m, _ := testManager(t, live)
	res := m.desired["pr"]
	res.Related = refs
	m.desired["pr"], m.running["pr"].res = res, res
	secretsGVR := refs[0].Resource
	secret := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "Secret",
		"metadata": map[string]any{"name": "s", "namespace": "ns", "uid": "u-s",
			"labels":      map[string]any{naming.LabelRelatedTo: "u-a", naming.LabelRelatedIdentifier: "tls"},
			"annotations": map[string]any{"kcp.io/cluster": "c"}}}}
	store := cache.NewIndexer(clusterKey, cache.Indexers{relatedOwnerIndex: indexRelatedOwner})
	if err := store.Add(secret); err != nil {
		t.Fatal(err)
	}
	m.relWatchers[secretsGVR] = &relatedWatcher{gvr: secretsGVR, synced: true, store: store}
	client := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(),
		map[schema.GroupVersionResource]string{secretsGVR: "SecretList", thingsGVR: "ThingList"}, secret.DeepCopy())
	m.clients["c"] = client
	m.vwURL = "https://kcp.invalid/vw"
	// The live object's UID under another name.
	forged := &ferryv1.ObjectKey{Cluster: "c", Resource: thingKey().GetResource(), Namespace: "ns", Name: "b", Uid: "u-a"}
	err = m.Release(context.Background(), "pr", forged)
	t.Logf("release: %v", err)
	// Control: the same confirmation for the live object's own key would
	// reach the copy (the test can fail).
	if got := copiesOf(m.relWatchers[secretsGVR], "u-a", ""); len(got) != 1 {
		t.Fatalf("the related copy is not found by its primary's UID: %d", len(got))
	}
	for _, a := range client.Actions() {
		if a.GetVerb() == "delete" {
			t.Fatalf("a related copy of the live object was deleted: %v", a)
		}
	}
}
