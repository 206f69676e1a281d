package replication

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	clienttesting "k8s.io/client-go/testing"

	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
	ferryv1alpha1 "github.com/ferry-dev/ferry/api/v1alpha1"
	"github.com/ferry-dev/ferry/pkg/related"
)

var configMapsGVR = schema.GroupVersionResource{Version: "v1", Resource: "configmaps"}

// watchedRef is a related entry of secrets located by spec.secretName
// (origin service unless kcp), with watch.labelSelector matchLabels sel
// when sel is set.
func watchedRef(t *testing.T, id string, origin ferryv1alpha1.RelatedResourceOrigin, gvr schema.GroupVersionResource, sel map[string]string) Related {
	t.Helper()
	s := ferryv1alpha1.RelatedResourceSpec{
		Identifier: id, Origin: origin, Kind: "Secret",
		Reference: &ferryv1alpha1.RelatedResourceReference{Name: ferryv1alpha1.ResourceLocator{Path: "spec.secretName"}},
	}
	if sel != nil {
		s.Watch = &ferryv1alpha1.RelatedResourceWatch{LabelSelector: metav1.LabelSelector{MatchLabels: sel}}
	}
	refs, err := related.Compile([]ferryv1alpha1.RelatedResourceSpec{s})
	if err != nil {
		t.Fatal(err)
	}
	return Related{Reference: refs[0], Local: gvr}
}

// TestRelatedInformerSelectors: a related kind's informers list and watch
// with a label selector only when every entry of the kind, in every
// PublishedResource, is service-origin and sets the same
// watch.labelSelector; otherwise they cache every object of the kind (and
// each entry's selector is applied on lookup).
func TestRelatedInformerSelectors(t *testing.T) {
	svc, kcp := ferryv1alpha1.OriginService, ferryv1alpha1.OriginKCP
	db := map[string]string{"managed-by": "db-operator"}
	other := map[string]string{"managed-by": "cache-operator"}
	for _, tc := range []struct {
		name string
		prs  [][]Related // PublishedResources, each with its entries
		want map[schema.GroupVersionResource]string
	}{
		{name: "no related entries", prs: [][]Related{nil}, want: map[schema.GroupVersionResource]string{}},
		{name: "one entry without watch", prs: [][]Related{{watchedRef(t, "a", svc, secretsGVR, nil)}},
			want: map[schema.GroupVersionResource]string{secretsGVR: ""}},
		{name: "one entry with watch", prs: [][]Related{{watchedRef(t, "a", svc, secretsGVR, db)}},
			want: map[schema.GroupVersionResource]string{secretsGVR: "managed-by=db-operator"}},
		{name: "two PublishedResources, the same selector", prs: [][]Related{{watchedRef(t, "a", svc, secretsGVR, db)}, {watchedRef(t, "b", svc, secretsGVR, db)}},
			want: map[schema.GroupVersionResource]string{secretsGVR: "managed-by=db-operator"}},
		{name: "two entries, different selectors", prs: [][]Related{{watchedRef(t, "a", svc, secretsGVR, db), watchedRef(t, "b", svc, secretsGVR, other)}},
			want: map[schema.GroupVersionResource]string{secretsGVR: ""}},
		{name: "one entry with watch, one without", prs: [][]Related{{watchedRef(t, "a", svc, secretsGVR, db)}, {watchedRef(t, "b", svc, secretsGVR, nil)}},
			want: map[schema.GroupVersionResource]string{secretsGVR: ""}},
		{name: "without first, then with", prs: [][]Related{{watchedRef(t, "a", svc, secretsGVR, nil), watchedRef(t, "b", svc, secretsGVR, db)}},
			want: map[schema.GroupVersionResource]string{secretsGVR: ""}},
		{name: "an origin kcp entry of the kind", prs: [][]Related{{watchedRef(t, "a", svc, secretsGVR, db), watchedRef(t, "b", kcp, secretsGVR, nil)}},
			want: map[schema.GroupVersionResource]string{secretsGVR: ""}},
		{name: "kinds apart", prs: [][]Related{{watchedRef(t, "a", svc, secretsGVR, db), watchedRef(t, "b", svc, configMapsGVR, nil)}, {watchedRef(t, "c", svc, secretsGVR, db)}},
			want: map[schema.GroupVersionResource]string{secretsGVR: "managed-by=db-operator", configMapsGVR: ""}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			published := map[string]*Published{}
			for i, rel := range tc.prs {
				name := fmt.Sprintf("pr-%d", i)
				published[name] = &Published{Name: name, Related: rel}
			}
			if got := relatedInformerSelectors(published); !maps.Equal(got, tc.want) {
				t.Errorf("selectors %v, want %v", got, tc.want)
			}
		})
	}
}

// secretListSelectors returns the label selectors of the fake cluster's
// list calls of secrets so far, in order.
func secretListSelectors(e *Engine) []string {
	var out []string
	for _, a := range e.opts.Dynamic.(*dynamicfake.FakeDynamicClient).Actions() {
		if l, ok := a.(clienttesting.ListAction); ok && a.GetResource() == secretsGVR {
			out = append(out, l.GetListRestrictions().Labels.String())
		}
	}
	return out
}

// relatedStatesByEntry is relatedStates keyed by workspace and identifier.
func relatedStatesByEntry(e *Engine) map[string]string {
	out := map[string]string{}
	for _, m := range reportsQueued(e) {
		r := m.GetRelatedObjectReport()
		if r == nil {
			continue
		}
		e.ReportResult(&ferryv1.ReportResult{ReportId: r.GetReportId()})
		st := "object"
		switch {
		case r.GetError() != nil:
			st = "error"
		case r.GetGone() != nil:
			st = "gone"
		case r.GetUnresolved() != nil:
			st = "unresolved"
		}
		out[r.GetRelatedTo().GetPrimary().GetCluster()+"/"+r.GetRelatedTo().GetIdentifier()] = st
	}
	return out
}

// TestWatchLabelSelectorNarrowsTheRelatedCache: with watch.labelSelector
// the edge lists and watches the related kind with those labels (the
// service cluster's other Secrets are never held), a referenced Secret
// without them is reported gone, and it appears once labelled. When
// another entry of the kind needs every Secret, the informers cache them
// all again, and the watching entry still finds only labelled ones.
func TestWatchLabelSelectorNarrowsTheRelatedCache(t *testing.T) {
	for _, clusterWide := range []bool{false, true} {
		t.Run(fmt.Sprintf("cluster-wide %v", clusterWide), func(t *testing.T) {
			ns := "local-ns" // ferry's namespace for workspace c1
			labelled := selectedSecret(ns, "labelled", map[string]string{"managed-by": "db-operator"})
			plain := selectedSecret(ns, "plain", nil)
			plainC := selectedSecret(ns, "plain-c", nil)
			watched := watchedRef(t, "creds", ferryv1alpha1.OriginService, secretsGVR, map[string]string{"managed-by": "db-operator"})
			e, _, _ := testEngineWith(t, engineSetup{related: []Related{watched}, relatedClusterWide: clusterWide}, labelled, plain, plainC)
			if got := secretListSelectors(e); len(got) == 0 || slices.ContainsFunc(got, func(s string) bool { return s != "managed-by=db-operator" }) {
				t.Fatalf("secrets listed with selectors %q, want only managed-by=db-operator", got)
			}
			cached := func(name string) bool {
				e.mu.Lock()
				defer e.mu.Unlock()
				_, ok := e.relWatches[secretsGVR].get(ns, name)
				return ok
			}
			if cached("plain") || cached("plain-c") || !cached("labelled") {
				t.Fatalf("cached: plain %v, plain-c %v, labelled %v; want only the labelled Secret", cached("plain"), cached("plain-c"), cached("labelled"))
			}

			ctx := context.Background()
			copies := e.opts.Dynamic.Resource(localGVR).Namespace(ns)
			secrets := e.opts.Dynamic.Resource(secretsGVR).Namespace(ns)
			states := map[string]string{}
			wait := func(want map[string]string) {
				t.Helper()
				waitFor(t, func() (bool, string) {
					maps.Copy(states, relatedStatesByEntry(e))
					for k, st := range want {
						if states[k] != st {
							return false, fmt.Sprintf("related states %v, want %v", states, want)
						}
					}
					return true, ""
				})
			}
			primaries := []*unstructured.Unstructured{primaryIn("ws-a", ns, "a-app", "labelled"), primaryIn("ws-b", ns, "b-app", "plain"), primaryIn("ws-c", ns, "c-app", "plain-c")}
			for _, p := range primaries {
				if _, err := copies.Create(ctx, p, metav1.CreateOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			wait(map[string]string{"ws-a/creds": "object", "ws-b/creds": "gone", "ws-c/creds": "gone"})

			// Labelled later: it appears by itself.
			relabel := func(name string, l map[string]string) {
				t.Helper()
				u, err := secrets.Get(ctx, name, metav1.GetOptions{})
				if err != nil {
					t.Fatal(err)
				}
				u.SetLabels(l)
				if _, err := secrets.Update(ctx, u, metav1.UpdateOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			relabel("plain", map[string]string{"managed-by": "db-operator"})
			wait(map[string]string{"ws-b/creds": "object"})
			relabel("plain", nil)
			wait(map[string]string{"ws-b/creds": "gone"})

			// Another entry of secrets without watch (its Secret: the
			// referenced name with "-other"): the informers list every
			// Secret again. The watching entry still does not find an
			// unlabelled Secret, the other does.
			for _, name := range []string{"labelled-other", "plain-other", "plain-c-other"} {
				if _, err := secrets.Create(ctx, selectedSecret(ns, name, nil), metav1.CreateOptions{}); err != nil {
					t.Fatal(err)
				}
			}
			refs, err := related.Compile([]ferryv1alpha1.RelatedResourceSpec{{
				Identifier: "any", Origin: ferryv1alpha1.OriginService, Kind: "Secret",
				Reference: &ferryv1alpha1.RelatedResourceReference{Name: ferryv1alpha1.ResourceLocator{Path: "spec.secretName",
					Regex: &ferryv1alpha1.RegexReplacement{Pattern: "$", Replacement: "-other"}}},
			}})
			if err != nil {
				t.Fatal(err)
			}
			before := len(secretListSelectors(e))
			e.mu.Lock()
			pub := *e.published["pr"]
			e.mu.Unlock()
			pub.Revision = "2"
			pub.Related = []Related{watched, {Reference: refs[0], Local: secretsGVR}}
			e.SetPublished(&pub)
			waitFor(t, func() (bool, string) {
				return cached("plain-c"), "the informers do not cache the unlabelled Secret after an entry without watch came"
			})
			if got := secretListSelectors(e)[before:]; slices.Contains(got, "managed-by=db-operator") {
				t.Errorf("listed with the selector after an entry without watch came: %q", got)
			}
			// Each primary's entries are evaluated together on the new cache,
			// which holds the unlabelled Secrets: once the new entry is
			// reported, the watching entry was evaluated again, and it
			// still does not find them (it would report the object).
			wait(map[string]string{"ws-a/creds": "object", "ws-a/any": "object", "ws-b/creds": "gone", "ws-b/any": "object",
				"ws-c/creds": "gone", "ws-c/any": "object"})
		})
	}
}

// TestWatchLabelSelectorBoundsObjectSelector: a label-selected entry
// (object.selector) with watch.labelSelector finds only objects matching
// both, also when its informers cache every Secret (a kcp-origin entry of
// secrets needs them all).
func TestWatchLabelSelectorBoundsObjectSelector(t *testing.T) {
	refs, err := related.Compile([]ferryv1alpha1.RelatedResourceSpec{{
		Identifier: "certs", Origin: ferryv1alpha1.OriginService, Resource: "secrets", Version: "v1", Kind: "Secret",
		Object: &ferryv1alpha1.RelatedResourceObject{RelatedResourceObjectSpec: ferryv1alpha1.RelatedResourceObjectSpec{
			Selector: &ferryv1alpha1.RelatedResourceObjectSelector{
				LabelSelector: metav1.LabelSelector{MatchLabels: map[string]string{"owner": "{{ .LocalObject.metadata.name }}"}},
				Rewrite:       ferryv1alpha1.RelatedResourceSelectorRewrite{Template: &ferryv1alpha1.TemplateExpression{Template: "{{ .Value }}"}},
			},
		}},
		Watch: &ferryv1alpha1.RelatedResourceWatch{LabelSelector: metav1.LabelSelector{MatchLabels: map[string]string{"managed-by": "db-operator"}}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	ns := "acc-watchsel"
	e, _, _ := testEngineWith(t, engineSetup{related: []Related{{Reference: refs[0], Local: secretsGVR}, kcpCredsRef(t)}, relatedClusterWide: true},
		selectedSecret(ns, "a-app-1", map[string]string{"owner": "a-app", "managed-by": "db-operator"}),
		selectedSecret(ns, "a-app-2", map[string]string{"owner": "a-app"}))
	if got := secretListSelectors(e); slices.Contains(got, "managed-by=db-operator") {
		t.Fatalf("listed with the selector though a kcp-origin entry of secrets needs every Secret: %q", got)
	}
	if _, err := e.opts.Dynamic.Resource(localGVR).Namespace(ns).Create(context.Background(), primaryIn("ws-a", ns, "a-app", ""), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	states := map[string]string{}
	waitFor(t, func() (bool, string) {
		maps.Copy(states, selectedNames(e))
		return states["ws-a"] == "a-app-1->a-app-1", fmt.Sprintf("states %v, want ws-a: a-app-1 only", states)
	})
}
