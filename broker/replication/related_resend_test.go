package replication

import (
	"context"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
	ferryv1alpha1 "github.com/ferry-dev/ferry/api/v1alpha1"
	"github.com/ferry-dev/ferry/pkg/related"
)

// TestResendRelatedSendsAnUnchangedRelatedObjectAgain: a kcp-origin
// related object is sent once per kcp resourceVersion; when the edge says
// its copy was deleted outside ferry (a ResendRequest naming the related
// entry), the same version is sent again so the copy comes back.
func TestResendRelatedSendsAnUnchangedRelatedObjectAgain(t *testing.T) {
	refs, err := related.Compile([]ferryv1alpha1.RelatedResourceSpec{{
		Identifier: "creds", Origin: ferryv1alpha1.OriginKCP, Kind: "Secret",
		Reference: &ferryv1alpha1.RelatedResourceReference{Name: ferryv1alpha1.ResourceLocator{Path: "spec.secretName"}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	primary := thing("1", map[string]any{"secretName": "creds"}, nil)
	secret := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "Secret",
		"metadata": map[string]any{"name": "creds", "namespace": "ns", "uid": "u-s", "resourceVersion": "7",
			"annotations": map[string]any{"kcp.io/cluster": "c"}},
		"data": map[string]any{"password": "aHVudGVyMg=="}}}
	res := thingsResource()
	res.Related = refs
	e := newEnv(t, res, primary, secret)
	m, intents := e.m, e.intents
	m.Applied("pr", &ferryv1.SyncIntent{Key: thingKey(), Operation: &ferryv1.SyncIntent_Upsert{Upsert: &ferryv1.UpsertIntent{ContentHash: "h"}}})
	rt := &ferryv1.RelatedTo{Primary: thingKey(), Identifier: "creds"}
	it := item{pr: "pr", key: storeKey(thingKey()), related: "creds"}
	sent := func() int {
		n := 0
		for in := intents.Next(); in != nil; in = intents.Next() {
			if in.GetRelatedTo().GetIdentifier() == "creds" && in.GetUpsert() != nil {
				n++
			}
			intents.Done(in.GetKey(), in.GetRelatedTo(), in.GetVersion())
		}
		return n
	}
	ctx := context.Background()
	if err := m.processRelated(ctx, it); err != nil {
		t.Fatal(err)
	}
	if n := sent(); n != 1 {
		t.Fatalf("first send: %d related intents, want 1", n)
	}
	if err := m.processRelated(ctx, it); err != nil {
		t.Fatal(err)
	}
	if n := sent(); n != 0 {
		t.Fatalf("an unchanged related object was sent again: %d", n)
	}
	m.ResendRelated("pr", rt)
	if err := m.processRelated(ctx, it); err != nil {
		t.Fatal(err)
	}
	if n := sent(); n != 1 {
		t.Fatalf("after the edge asked for it again: %d related intents, want 1", n)
	}
}
