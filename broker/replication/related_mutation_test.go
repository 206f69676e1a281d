package replication

import (
	"context"
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"

	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
	ferryv1alpha1 "github.com/ferry-dev/ferry/api/v1alpha1"
	"github.com/ferry-dev/ferry/pkg/objects"
	"github.com/ferry-dev/ferry/pkg/related"
)

// relatedMutation is a mutation of a Secret: a regex on a data key's
// value (base64 of "db-host" → of "db-prod"), a label set by CEL, and the
// status field secretRef removed.
func relatedMutation() *ferryv1alpha1.ResourceMutationSpec {
	return &ferryv1alpha1.ResourceMutationSpec{
		Spec: []ferryv1alpha1.ResourceMutation{
			{Regex: &ferryv1alpha1.RegexMutation{Path: "data.host", Pattern: "^ZGItaG9zdA==$", Replacement: "ZGItcHJvZA=="}},
			{CEL: &ferryv1alpha1.CELMutation{Path: "metadata.labels.copied-by", Expression: "'ferry'"}},
		},
	}
}

// TestRelatedMutationOfKCPOrigin: the kcp object is mutated on its way
// down (the intent carries the mutated content), and the state the
// broker records is the hash of what it sent — what the edge applies and
// lists in its inventory — so an unchanged object is not sent again.
func TestRelatedMutationOfKCPOrigin(t *testing.T) {
	refs, err := related.Compile([]ferryv1alpha1.RelatedResourceSpec{{
		Identifier: "creds", Origin: ferryv1alpha1.OriginKCP, Kind: "Secret", Mutation: relatedMutation(),
		Reference: &ferryv1alpha1.RelatedResourceReference{Name: ferryv1alpha1.ResourceLocator{Path: "spec.secretName"}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	secret := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "Secret",
		"metadata": map[string]any{"name": "creds", "namespace": "ns", "uid": "u-s", "resourceVersion": "7",
			"annotations": map[string]any{"kcp.io/cluster": "c"}},
		"data": map[string]any{"host": "ZGItaG9zdA=="}}}
	res := thingsResource()
	res.Related = refs
	e := newEnv(t, res, thing("1", map[string]any{"secretName": "creds"}, nil), secret)
	m, intents := e.m, e.intents
	m.Applied("pr", &ferryv1.SyncIntent{Key: thingKey(), Operation: &ferryv1.SyncIntent_Upsert{Upsert: &ferryv1.UpsertIntent{ContentHash: "h"}}})
	it := item{pr: "pr", key: storeKey(thingKey()), related: "creds"}
	ctx := context.Background()
	if err := m.processRelated(ctx, it); err != nil {
		t.Fatal(err)
	}
	var sent []*ferryv1.SyncIntent
	for in := intents.Next(); in != nil; in = intents.Next() {
		if in.GetRelatedTo().GetIdentifier() == "creds" && in.GetUpsert() != nil {
			sent = append(sent, in)
		}
		intents.Done(in.GetKey(), in.GetRelatedTo(), in.GetVersion())
	}
	if len(sent) != 1 {
		t.Fatalf("%d related intents, want 1", len(sent))
	}
	var got map[string]any
	if err := json.Unmarshal(sent[0].GetUpsert().GetObject(), &got); err != nil {
		t.Fatal(err)
	}
	want := map[string]any{"apiVersion": "v1", "kind": "Secret", "data": map[string]any{"host": "ZGItcHJvZA=="},
		"metadata": map[string]any{"labels": map[string]any{"copied-by": "ferry"}}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("sent %v, want %v", got, want)
	}
	m.mu.Lock()
	state := m.relSent.sent[it]
	m.mu.Unlock()
	if hash := objects.RelatedHash(&unstructured.Unstructured{Object: got}); !strings.HasSuffix(state, "@"+hash) {
		t.Errorf("recorded state %q is not of the mutated content (hash %s)", state, hash)
	}
}

// TestRelatedMutationOfServiceOrigin: the object the edge reports is
// mutated on its way into kcp, its status (syncStatus) by the status
// steps; a step that cannot apply writes nothing and says so in an
// Event.
func TestRelatedMutationOfServiceOrigin(t *testing.T) {
	mut := relatedMutation()
	mut.Status = []ferryv1alpha1.ResourceMutation{{Delete: &ferryv1alpha1.DeleteMutation{Path: "status.secretRef"}}}
	refs, err := related.Compile([]ferryv1alpha1.RelatedResourceSpec{{
		Identifier: "db", Origin: ferryv1alpha1.OriginService, Kind: "Secret", SyncStatus: true, Mutation: mut,
		Reference: &ferryv1alpha1.RelatedResourceReference{Name: ferryv1alpha1.ResourceLocator{Path: "spec.secretName"}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	res := thingsResource()
	res.Related = refs
	e := newEnv(t, res, thing("1", map[string]any{"secretName": "app-db"}, nil))
	ctx := context.Background()
	report := func(obj string) error {
		return e.m.WriteRelated(ctx, "pr", &ferryv1.RelatedObjectReport{
			RelatedTo: &ferryv1.RelatedTo{Primary: thingKey(), Identifier: "db"},
			State:     &ferryv1.RelatedObjectReport_Object{Object: []byte(obj)},
		})
	}
	if err := report(`{"data":{"host":"ZGItaG9zdA==","port":"NTQzMg=="},"status":{"phase":"Ready","secretRef":"x"}}`); err != nil {
		t.Fatal(err)
	}
	secrets := e.kcp.Resource(schema.GroupVersionResource{Version: "v1", Resource: "secrets"}).Namespace("ns")
	got, err := secrets.Get(ctx, "app-db", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if d := got.Object["data"]; !reflect.DeepEqual(d, map[string]any{"host": "ZGItcHJvZA==", "port": "NTQzMg=="}) {
		t.Errorf("data %v", d)
	}
	if got.GetLabels()["copied-by"] != "ferry" {
		t.Errorf("labels %v", got.GetLabels())
	}
	if st := got.Object["status"]; !reflect.DeepEqual(st, map[string]any{"phase": "Ready"}) {
		t.Errorf("status %v", st)
	}
	// data.host holds no string: the regex cannot apply.
	if err := report(`{"data":{"host":{"x":"y"}}}`); err != nil {
		t.Fatal(err)
	}
	if got, err = secrets.Get(ctx, "app-db", metav1.GetOptions{}); err != nil {
		t.Fatal(err)
	}
	if d := got.Object["data"]; !reflect.DeepEqual(d, map[string]any{"host": "ZGItcHJvZA==", "port": "NTQzMg=="}) {
		t.Errorf("a failed mutation wrote %v", d)
	}
	if msg := eventMessage(t, e, "RelatedMutationFailed"); !strings.Contains(msg, `related "db": mutation.spec[0].regex`) || !strings.Contains(msg, "is not written") {
		t.Errorf("RelatedMutationFailed Event: %q", msg)
	}
}
