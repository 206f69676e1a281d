package engine

import (
	"strings"
	"testing"

	"github.com/go-logr/logr"

	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
	ferryv1alpha1 "github.com/ferry-dev/ferry/api/v1alpha1"
	"github.com/ferry-dev/ferry/broker/config"
	"github.com/ferry-dev/ferry/broker/replication"
)

// TestRelatedClaimsFollowTheBrokersAllowList: the broker used to claim in
// kcp whatever an edge's related[] named. Now only what the edge's entry in
// the broker's configuration allows (default secrets and configmaps).
func TestRelatedClaimsFollowTheBrokersAllowList(t *testing.T) {
	publishWith := func(kinds ...[2]string) *ferryv1alpha1.PublishedResourceSpec {
		spec := &ferryv1alpha1.PublishedResourceSpec{}
		for i, k := range kinds {
			spec.Related = append(spec.Related, ferryv1alpha1.RelatedResourceSpec{
				Identifier: "r" + string(rune('a'+i)), Origin: ferryv1alpha1.OriginService, Group: k[0], Kind: k[1],
				Reference: &ferryv1alpha1.RelatedResourceReference{Name: ferryv1alpha1.ResourceLocator{Path: "spec.name"}},
			})
		}
		return spec
	}
	cases := []struct {
		name    string
		allowed []string
		spec    *ferryv1alpha1.PublishedResourceSpec
		refused string // part of the message; "" = not refused
	}{
		{name: "secrets by default", spec: publishWith([2]string{"", "Secret"}, [2]string{"", "ConfigMap"})},
		{name: "a ClusterRoleBinding", spec: publishWith([2]string{"rbac.authorization.k8s.io", "ClusterRoleBinding"}),
			refused: "clusterrolebindings.rbac.authorization.k8s.io"},
		{name: "a kind not in the default list", spec: publishWith([2]string{"", "Secret"}, [2]string{"example.com", "Widget"}),
			refused: "spec.related[rb]: the broker's configuration does not let this edge claim widgets.example.com"},
		{name: "a kind the entry allows", allowed: []string{"widgets.example.com"}, spec: publishWith([2]string{"example.com", "Widget"})},
		{name: "the APIExport's own resource", spec: publishWith([2]string{"export.example", "Grant"})},
		{name: "secrets not in an explicit list", allowed: []string{"widgets.example.com"}, spec: publishWith([2]string{"", "Secret"}), refused: "secrets"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			mgr := replication.NewManager(replication.Options{EdgeName: "edge", Log: logr.Discard()})
			w := newPublishWorker(nil, config.APIExportRef{Workspace: "root:org", Name: "export.example"}, func(*ferryv1.PublishResult) {}, logr.Discard(), mgr,
				config.Edge{RelatedResources: tc.allowed}.AllowsRelated)
			res := w.refuseRelated(&ferryv1.Publish{PublishedResource: "pr"}, tc.spec)
			switch {
			case tc.refused == "" && res != nil:
				t.Fatalf("refused: %v", res)
			case tc.refused != "" && (res.GetState() != ferryv1.PublishState_PUBLISH_STATE_FAILED || !strings.Contains(res.GetMessage(), tc.refused)):
				t.Fatalf("result %v, want a refusal naming %q", res, tc.refused)
			case tc.refused != "" && mgr.Refused() != 1:
				t.Errorf("refusals counted %d, want 1", mgr.Refused())
			}
		})
	}
}
