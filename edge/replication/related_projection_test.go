package replication

import (
	"testing"

	"k8s.io/apimachinery/pkg/runtime"

	dynamicfake "k8s.io/client-go/dynamic/fake"
	k8stesting "k8s.io/client-go/testing"

	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
	ferryv1alpha1 "github.com/ferry-dev/ferry/api/v1alpha1"
	"github.com/ferry-dev/ferry/pkg/naming"
	"github.com/ferry-dev/ferry/pkg/related"
)

// TestProjectedKCPRelatedIsWrittenLocallyAsTheProjection: a kcp-origin
// entry projected onto another resource of the service cluster (a Secret
// in kcp written as a ConfigMap locally) is applied to the projected
// resource as the kind the service cluster serves it as, whatever kind the
// broker's intent carries.
func TestProjectedKCPRelatedIsWrittenLocallyAsTheProjection(t *testing.T) {
	refs, err := related.Compile([]ferryv1alpha1.RelatedResourceSpec{{
		Identifier: "settings", Origin: ferryv1alpha1.OriginKCP, Version: "v1", Resource: "secrets",
		Projection: &ferryv1alpha1.RelatedResourceProjection{Resource: "configmaps"},
		Object: &ferryv1alpha1.RelatedResourceObject{RelatedResourceObjectSpec: ferryv1alpha1.RelatedResourceObjectSpec{
			Reference: &ferryv1alpha1.RelatedResourceObjectReference{Path: "spec.secretName"}}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	ref := refs[0]
	if ref.Service != configMapsGVR || ref.Resource != secretsGVR {
		t.Fatalf("service %v, kcp %v: want configmaps locally, secrets in kcp", ref.Service, ref.Resource)
	}
	ref.ResolveServiceKind("ConfigMap") // what the edge's discovery says
	primary := primaryIn("c1", "local-ns", "app-copy", "settings")
	e, w, sink := testEngineWith(t, engineSetup{related: []Related{{Reference: ref, Local: configMapsGVR}}}, []runtime.Object{primary}...)
	acceptApplies(e)
	remote, _ := naming.RemoteFrom(primary.GetLabels(), primary.GetAnnotations())
	pk := remoteKey(w.pub, remote)
	e.Handle(&ferryv1.SyncIntent{Key: &ferryv1.ObjectKey{Cluster: "c1", Namespace: "default", Name: "settings", Uid: "u-s",
		Resource: &ferryv1.GroupVersionResource{Version: "v1", Resource: "secrets"}}, PublishedResource: "pr",
		RelatedTo: &ferryv1.RelatedTo{Primary: pk, Identifier: "settings"}, Version: &ferryv1.ObjectVersion{Sequence: 1, ResourceVersion: "7"},
		Operation: &ferryv1.SyncIntent_Upsert{Upsert: &ferryv1.UpsertIntent{Object: []byte(`{"apiVersion":"v1","kind":"Secret","data":{"mode":"ZmFzdA=="}}`)}}})
	runQueue(t, e)
	answers := relatedAnswers(sink)
	if len(answers) != 1 || answers[0].GetError() != nil {
		t.Fatalf("answers %v, want one success", answers)
	}
	var applied []string
	for _, a := range e.opts.Dynamic.(*dynamicfake.FakeDynamicClient).Actions() {
		if p, ok := a.(k8stesting.PatchAction); ok && a.GetResource().Resource != "publishedresources" {
			applied = append(applied, a.GetResource().Resource+"/"+p.GetName())
		}
	}
	if len(applied) != 1 || applied[0] != "configmaps/settings" {
		t.Fatalf("applied %v, want configmaps/settings", applied)
	}
	got := patches(t, e)
	if got[0].GetKind() != "ConfigMap" || got[0].GetAPIVersion() != "v1" {
		t.Errorf("applied as %s %s, want v1 ConfigMap", got[0].GetAPIVersion(), got[0].GetKind())
	}
}
