package engine

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/go-logr/logr"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"

	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
	ferryv1alpha1 "github.com/ferry-dev/ferry/api/v1alpha1"
	"github.com/ferry-dev/ferry/broker/config"
	"github.com/ferry-dev/ferry/broker/replication"
)

// TestProjectedRelatedFollowsTheAllowList: the broker's allow-list is about
// what it claims in kcp, so a projected entry is checked under its kcp-side
// resource: the projection for origin service, the configured resource for
// origin kcp; a projection into the APIExport's own group needs nothing.
func TestProjectedRelatedFollowsTheAllowList(t *testing.T) {
	entry := func(origin ferryv1alpha1.RelatedResourceOrigin, group, resource string, p ferryv1alpha1.RelatedResourceProjection) *ferryv1alpha1.PublishedResourceSpec {
		return &ferryv1alpha1.PublishedResourceSpec{Related: []ferryv1alpha1.RelatedResourceSpec{{
			Identifier: "x", Origin: origin, Group: group, Resource: resource, Projection: &p,
			Object: &ferryv1alpha1.RelatedResourceObject{RelatedResourceObjectSpec: ferryv1alpha1.RelatedResourceObjectSpec{
				Reference: &ferryv1alpha1.RelatedResourceObjectReference{Path: "spec.name"}}},
		}}}
	}
	for _, tc := range []struct {
		name    string
		spec    *ferryv1alpha1.PublishedResourceSpec
		refused string
	}{
		{name: "a local CRD projected into the export's group", spec: entry(ferryv1alpha1.OriginService, "db.corp.example", "userdatabases", ferryv1alpha1.RelatedResourceProjection{Group: "export.example"})},
		{name: "a configmap projected onto widgets in kcp", spec: entry(ferryv1alpha1.OriginService, "", "configmaps", ferryv1alpha1.RelatedResourceProjection{Group: "example.com", Resource: "widgets"}),
			refused: "claim widgets.example.com"},
		{name: "origin kcp: secrets in kcp, widgets locally", spec: entry(ferryv1alpha1.OriginKCP, "", "secrets", ferryv1alpha1.RelatedResourceProjection{Group: "example.com", Resource: "widgets"})},
	} {
		t.Run(tc.name, func(t *testing.T) {
			mgr := replication.NewManager(replication.Options{EdgeName: "edge", Log: logr.Discard()})
			w := newPublishWorker(nil, config.APIExportRef{Workspace: "root:org", Name: "export.example"}, func(*ferryv1.PublishResult) {}, logr.Discard(), mgr,
				config.Edge{}.AllowsRelated)
			res := w.refuseRelated(&ferryv1.Publish{PublishedResource: "pr"}, tc.spec)
			switch {
			case tc.refused == "" && res != nil:
				t.Fatalf("refused: %v", res.GetMessage())
			case tc.refused != "" && !strings.Contains(res.GetMessage(), tc.refused):
				t.Fatalf("result %v, want a refusal naming %q", res, tc.refused)
			}
		})
	}
}

// TestSyncedResourceTakesTheProjectedKinds: the sync engine writes a
// projected service-origin entry's copies as the kind the publisher found in
// kcp, not the service cluster's; a publish that found none is an error
// rather than copies without a kind.
func TestSyncedResourceTakesTheProjectedKinds(t *testing.T) {
	spec := &ferryv1alpha1.PublishedResourceSpec{
		Resource: ferryv1alpha1.SourceResource{APIGroup: "mq.corp.example", Kind: "Queue"},
		Related: []ferryv1alpha1.RelatedResourceSpec{{
			Identifier: "db", Origin: ferryv1alpha1.OriginService, Group: "db.corp.example", Version: "v1alpha1", Resource: "userdatabases",
			Projection: &ferryv1alpha1.RelatedResourceProjection{Group: "export.example", Version: "v1"},
			Object: &ferryv1alpha1.RelatedResourceObject{RelatedResourceObjectSpec: ferryv1alpha1.RelatedResourceObjectSpec{
				Reference: &ferryv1alpha1.RelatedResourceObjectReference{Path: "spec.db"}}},
		}},
	}
	specJSON, _ := json.Marshal(spec)
	crdJSON, _ := json.Marshal(&apiextensionsv1.CustomResourceDefinition{Spec: apiextensionsv1.CustomResourceDefinitionSpec{
		Group: "mq.corp.example", Versions: []apiextensionsv1.CustomResourceDefinitionVersion{{Name: "v1", Served: true, Storage: true}}}})
	msg := &ferryv1.Publish{PublishedResource: "queues", Spec: specJSON, CustomResourceDefinition: crdJSON}
	res := &ferryv1.PublishResult{
		ServedResource: &ferryv1.GroupVersionResource{Group: "export.example", Version: "v1", Resource: "queues"},
		RelatedKinds:   []*ferryv1.RelatedKind{{Identifier: "db", Kind: "UserDatabase"}},
	}
	r, ok, err := syncedResource(msg, spec, res)
	if err != nil || !ok {
		t.Fatalf("syncedResource: %v, %v", ok, err)
	}
	ref := r.Related[0]
	if got := ref.Kind.String(); got != "export.example/v1, Kind=UserDatabase" {
		t.Errorf("kind in kcp = %s, want export.example/v1, Kind=UserDatabase", got)
	}
	if got := ref.Resource.String(); got != "export.example/v1, Resource=userdatabases" {
		t.Errorf("resource in kcp = %s", got)
	}
	res.RelatedKinds = nil
	if _, _, err := syncedResource(msg, spec, res); err == nil || !strings.Contains(err.Error(), "found no kind in kcp") {
		t.Errorf("without kinds: error %v, want found no kind in kcp", err)
	}
}
