package replication

import (
	"context"
	"strings"
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

// TestRelatedWaitsForTheAppliedPrimary: a related object is placed where
// the reference on the local primary points. The broker sends it once the
// edge acknowledged the primary, but the edge's informer may still hold
// the primary's previous version (or none yet): the related copy used to
// be written at the place the stale copy named (or refused, and retried by
// the broker with backoff). It now waits, unanswered, until the cache holds
// the version this engine applied, and is placed on that informer event.
func TestRelatedWaitsForTheAppliedPrimary(t *testing.T) {
	for _, tc := range []struct {
		name   string
		cached func(current *unstructured.Unstructured) *unstructured.Unstructured // nil: not in the cache yet
	}{
		{name: "the cache holds the previous version", cached: func(current *unstructured.Unstructured) *unstructured.Unstructured {
			old := current.DeepCopy()
			old.Object["spec"] = map[string]any{"secretName": "old-creds"}
			old.SetAnnotations(objects.MergeStrings(old.GetAnnotations(), map[string]string{naming.AnnotationContentHash: "h1"}))
			return old
		}},
		{name: "the cache does not hold it yet", cached: func(*unstructured.Unstructured) *unstructured.Unstructured { return nil }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			// The primary's copy goes where the default naming rules put
			// it: namespace c1, which ferry made for workspace c1.
			remote := naming.Remote{ClusterName: "c1", Namespace: "default", Name: "app"}
			ns, name := defaultPlace(t, remote)
			current := primaryIn("c1", ns, name, "creds")
			current.SetAnnotations(objects.MergeStrings(current.GetAnnotations(), map[string]string{naming.AnnotationContentHash: "h2"}))
			remote, _ = naming.RemoteFrom(current.GetLabels(), current.GetAnnotations())
			objs := []runtime.Object{ferryNamespace(ns, "c1")}
			old := tc.cached(current)
			if old != nil {
				objs = append(objs, old)
			}
			e, w, sink := testEngineWith(t, engineSetup{related: []Related{kcpCredsRef(t)}}, objs...)
			acceptApplies(e)
			pk := remoteKey(w.pub, remote)
			// This engine applies the primary's current version (h2); the
			// service cluster answers, the informer does not see it yet.
			e.Handle(&ferryv1.SyncIntent{Key: pk, PublishedResource: "pr", Version: &ferryv1.ObjectVersion{Sequence: 1, ResourceVersion: "6"},
				Operation: &ferryv1.SyncIntent_Upsert{Upsert: &ferryv1.UpsertIntent{ContentHash: "h2",
					Object: []byte(`{"apiVersion":"kcp.example/v1","kind":"Thing","metadata":{"name":"app","namespace":"default"},"spec":{"secretName":"creds"}}`)}}})
			runQueue(t, e)
			if got := relatedAnswers(sink); len(sink.msgs) != 1 || len(got) != 0 || sink.msgs[0].GetIntentResult().GetError() != nil {
				t.Fatalf("the primary's apply: answers %v, want one success", sink.msgs)
			}

			e.Handle(&ferryv1.SyncIntent{Key: &ferryv1.ObjectKey{Cluster: "c1", Namespace: "default", Name: "creds", Uid: "u-s"}, PublishedResource: "pr",
				RelatedTo: &ferryv1.RelatedTo{Primary: pk, Identifier: "creds"}, Version: &ferryv1.ObjectVersion{Sequence: 1, ResourceVersion: "7"},
				Operation: &ferryv1.SyncIntent_Upsert{Upsert: &ferryv1.UpsertIntent{Object: []byte(`{"apiVersion":"v1","kind":"Secret","data":{"password":"aA=="}}`)}}})
			runQueue(t, e)
			if got := secretPatches(t, e); len(got) != 0 {
				t.Fatalf("placed by a stale primary: wrote %s", nsName(got[0].GetNamespace(), got[0].GetName()))
			}
			if got := relatedAnswers(sink); len(got) != 0 {
				t.Fatalf("answered while the cache is stale: %v", got)
			}

			// The informer catches up.
			copies := e.opts.Dynamic.Resource(localGVR).Namespace(ns)
			var err error
			if old != nil {
				_, err = copies.Update(context.Background(), current, metav1.UpdateOptions{})
			} else {
				_, err = copies.Create(context.Background(), current, metav1.CreateOptions{})
			}
			if err != nil {
				t.Fatal(err)
			}
			waitFor(t, func() (bool, string) {
				runQueue(t, e)
				return len(secretPatches(t, e)) > 0, "the related object is not written after the informer event"
			})
			got := secretPatches(t, e)
			if len(got) != 1 || got[0].GetName() != "creds" || got[0].GetNamespace() != ns {
				t.Fatalf("after the informer event: writes %v, want %s/creds", got, ns)
			}
			answers := relatedAnswers(sink)
			if len(answers) != 1 || answers[0].GetError() != nil {
				t.Fatalf("answers %v, want one success", answers)
			}
		})
	}
}

// defaultPlace is where the default naming rules put remote's copy.
func defaultPlace(t *testing.T, remote naming.Remote) (ns, name string) {
	t.Helper()
	rules, err := naming.Compile(nil)
	if err != nil {
		t.Fatal(err)
	}
	ns, name, err = rules.Local(remote, true)
	if err != nil {
		t.Fatal(err)
	}
	return ns, name
}

// ferryNamespace is namespace ns as this agent creates it for workspace ws.
func ferryNamespace(ns, ws string) *unstructured.Unstructured {
	u := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "Namespace"}}
	u.SetName(ns)
	u.SetLabels(map[string]string{naming.LabelAgent: "nora", naming.LabelWorkspace: ws})
	return u
}

// secretPatches are the applies of Secrets sent to the service cluster.
func secretPatches(t *testing.T, e *Engine) []*unstructured.Unstructured {
	t.Helper()
	var out []*unstructured.Unstructured
	for _, u := range patches(t, e) {
		if u.GetKind() == "Secret" {
			out = append(out, u)
		}
	}
	return out
}

// relatedAnswers are the answers to related intents the sink received.
func relatedAnswers(sink *recordingSink) []*ferryv1.IntentResult {
	var out []*ferryv1.IntentResult
	for _, m := range sink.msgs {
		if r := m.GetIntentResult(); r != nil && r.GetRelatedTo() != nil {
			out = append(out, r)
		}
	}
	return out
}

// TestRelatedNamespaceThatDoesNotExistYet: a kcp-origin related object
// whose namespace rule derives the namespace from the primary's local
// namespace (api-syncagent's "new namespace" scenario: a regex on
// metadata.namespace) used to be refused with "namespace … exists and was
// not created by ferry" although it did not exist. The edge now creates it,
// labelled for the workspace, when the primary's namespace is one ferry
// created for that workspace; otherwise it refuses and says only what it
// knows: the namespace is not one ferry created for the workspace (its cache
// holds only those).
func TestRelatedNamespaceThatDoesNotExistYet(t *testing.T) {
	refs, err := related.Compile([]ferryv1alpha1.RelatedResourceSpec{{
		Identifier: "creds", Origin: ferryv1alpha1.OriginKCP, Kind: "Secret",
		Reference: &ferryv1alpha1.RelatedResourceReference{
			Name:      ferryv1alpha1.ResourceLocator{Path: "spec.secretName"},
			Namespace: &ferryv1alpha1.ResourceLocator{Path: "metadata.namespace", Regex: &ferryv1alpha1.RegexReplacement{Pattern: "(.*)", Replacement: `\1-secrets`}},
		},
	}, {
		Identifier: "consumer-chosen", Origin: ferryv1alpha1.OriginKCP, Kind: "Secret",
		Reference: &ferryv1alpha1.RelatedResourceReference{
			Name:      ferryv1alpha1.ResourceLocator{Path: "spec.secretName"},
			Namespace: &ferryv1alpha1.ResourceLocator{Path: "spec.secretName"},
		},
	}})
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, primaryNS, identifier string
		ferrysPrimaryNS             bool
		wantCreated                 string // namespace created for workspace c1
		wantRefusal                 string // a FORBIDDEN naming this
	}{
		{name: "derived from ferry's namespace of the workspace", primaryNS: "c1", identifier: "creds", ferrysPrimaryNS: true, wantCreated: "c1-secrets"},
		{name: "derived from a namespace ferry did not create", primaryNS: "team", identifier: "creds", wantRefusal: "namespace team-secrets is not one ferry created for this workspace (it does not exist, or the service cluster made it)"},
		{name: "written by the consumer", primaryNS: "c1", identifier: "consumer-chosen", ferrysPrimaryNS: true, wantRefusal: "namespace creds is not one ferry created for this workspace (it does not exist, or the service cluster made it)"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			primary := primaryIn("c1", tc.primaryNS, "app-copy", "creds")
			objs := []runtime.Object{primary}
			if tc.ferrysPrimaryNS {
				objs = append(objs, ferryNamespace(tc.primaryNS, "c1"))
			}
			rels := []Related{{Reference: refs[0], Local: secretsGVR}, {Reference: refs[1], Local: secretsGVR}}
			e, w, sink := testEngineWith(t, engineSetup{related: rels}, objs...)
			acceptApplies(e)
			remote, _ := naming.RemoteFrom(primary.GetLabels(), primary.GetAnnotations())
			pk := remoteKey(w.pub, remote)
			e.Handle(&ferryv1.SyncIntent{Key: &ferryv1.ObjectKey{Cluster: "c1", Namespace: "default", Name: "creds", Uid: "u-s"}, PublishedResource: "pr",
				RelatedTo: &ferryv1.RelatedTo{Primary: pk, Identifier: tc.identifier}, Version: &ferryv1.ObjectVersion{Sequence: 1, ResourceVersion: "7"},
				Operation: &ferryv1.SyncIntent_Upsert{Upsert: &ferryv1.UpsertIntent{Object: []byte(`{"apiVersion":"v1","kind":"Secret","data":{"password":"aA=="}}`)}}})
			runQueue(t, e)
			answers := relatedAnswers(sink)
			if len(answers) != 1 {
				t.Fatalf("answers %v, want one", answers)
			}
			got := answers[0].GetError()
			if tc.wantRefusal != "" {
				if got.GetReason() != ferryv1.ApplyErrorReason_APPLY_ERROR_REASON_FORBIDDEN || !strings.Contains(got.GetMessage(), tc.wantRefusal) ||
					strings.Contains(got.GetMessage(), "exists and was not created") {
					t.Fatalf("answer %v, want FORBIDDEN saying %q (and not that it exists)", got, tc.wantRefusal)
				}
				// Counted on the PublishedResource.
				msg, objects, _ := lastStatusWrite(t, e)
				if n, _ := objects["relatedFailing"].(float64); n != 1 || !strings.Contains(msg, "1 related object is refused") {
					t.Fatalf("status.objects %v, Synced %q: want the related refusal counted", objects, msg)
				}
				return
			}
			if got.GetReason() == ferryv1.ApplyErrorReason_APPLY_ERROR_REASON_FORBIDDEN {
				t.Fatalf("refused: %v", got)
			}
			ns, err := e.opts.Kube.CoreV1().Namespaces().Get(context.Background(), tc.wantCreated, metav1.GetOptions{})
			if err != nil {
				t.Fatalf("namespace %s not created: %v", tc.wantCreated, err)
			}
			if ns.Labels[naming.LabelWorkspace] != "c1" {
				t.Fatalf("namespace %s labels %v, want it labelled for workspace c1", tc.wantCreated, ns.Labels)
			}
		})
	}
}
