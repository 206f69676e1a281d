package replication

import (
	"context"
	"fmt"
	"maps"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
	ferryv1alpha1 "github.com/ferry-dev/ferry/api/v1alpha1"
	"github.com/ferry-dev/ferry/pkg/related"
)

// listedStates returns, per primary workspace, the latest list report:
// each item's local name, "!" marking one that does not exist
// ("conflict" / "unresolved: …" for those states), and answers the
// reports.
func listedStates(e *Engine) map[string]string {
	out := map[string]string{}
	for _, m := range reportsQueued(e) {
		r := m.GetRelatedObjectReport()
		if r == nil {
			continue
		}
		e.ReportResult(&ferryv1.ReportResult{ReportId: r.GetReportId()})
		ws := r.GetRelatedTo().GetPrimary().GetCluster()
		switch {
		case r.GetError().GetReason() == ferryv1.ApplyErrorReason_APPLY_ERROR_REASON_CONFLICT:
			out[ws] = "conflict"
		case r.GetUnresolved() != nil:
			out[ws] = "unresolved: " + r.GetUnresolved().GetMessage()
		case r.GetObjects() != nil:
			var names []string
			for _, en := range r.GetObjects().GetEntries() {
				n := en.GetLocalName()
				switch {
				case en.GetGone():
					n += "!"
				case len(en.GetObject()) == 0 || en.GetName() != "":
					n += "?" // an entry of a list names no kcp name and has content
				}
				names = append(names, n)
			}
			out[ws] = strings.Join(names, ",")
		default:
			out[ws] = fmt.Sprintf("%T", r.GetState())
		}
	}
	return out
}

// listPrimary is a primary copy in workspace ws whose spec.users names
// users (one Secret each, api-syncagent's list reference).
func listPrimary(ws, ns, name string, users ...string) *unstructured.Unstructured {
	u := primaryIn(ws, ns, name, "")
	items := make([]any, 0, len(users))
	for _, n := range users {
		items = append(items, map[string]any{"name": n})
	}
	u.Object["spec"] = map[string]any{"users": items}
	return u
}

// TestListReferenceReportsEachItem: a list reference reports one entry per
// item of the list on the local primary, in its order, whether the
// object exists or not; an object created, deleted or dropped from the
// list is noticed from the informers' events; an item that cannot be
// evaluated makes the whole reference unresolved; an object another
// primary names too is copied for neither.
func TestListReferenceReportsEachItem(t *testing.T) {
	refs, err := related.Compile([]ferryv1alpha1.RelatedResourceSpec{{
		Identifier: "users", Origin: ferryv1alpha1.OriginService, Resource: "secrets", Version: "v1", Kind: "Secret",
		Object: &ferryv1alpha1.RelatedResourceObject{RelatedResourceObjectSpec: ferryv1alpha1.RelatedResourceObjectSpec{
			Reference: &ferryv1alpha1.RelatedResourceObjectReference{Path: "spec.users.#.name",
				Regex: &ferryv1alpha1.RegexReplacement{Pattern: "^(.*)$", Replacement: `\1-creds`}},
		}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	ns := "acc-list"
	e, _, _ := testEngineWith(t, engineSetup{related: []Related{{Reference: refs[0], Local: secretsGVR}}, relatedClusterWide: true},
		selectedSecret(ns, "alice-creds", nil), selectedSecret(ns, "bob-creds", nil))
	ctx := context.Background()
	secrets := e.opts.Dynamic.Resource(secretsGVR).Namespace(ns)
	copies := e.opts.Dynamic.Resource(localGVR).Namespace(ns)
	states := map[string]string{}
	wait := func(want map[string]string) {
		t.Helper()
		waitFor(t, func() (bool, string) {
			maps.Copy(states, listedStates(e))
			for ws, st := range want {
				// A trailing * matches any rest (an error message).
				if prefix, ok := strings.CutSuffix(st, "*"); ok && strings.HasPrefix(states[ws], prefix) {
					continue
				}
				if states[ws] != st {
					return false, fmt.Sprintf("states %v, want %v", states, want)
				}
			}
			return true, ""
		})
	}
	if _, err := copies.Create(ctx, listPrimary("ws-a", ns, "a-app", "bob", "carol", "alice"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	// The list's order, and carol's Secret does not exist yet.
	wait(map[string]string{"ws-a": "bob-creds,carol-creds!,alice-creds"})

	if _, err := secrets.Create(ctx, selectedSecret(ns, "carol-creds", nil), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	wait(map[string]string{"ws-a": "bob-creds,carol-creds,alice-creds"})

	if err := secrets.Delete(ctx, "bob-creds", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	wait(map[string]string{"ws-a": "bob-creds!,carol-creds,alice-creds"})

	update := func(p *unstructured.Unstructured) {
		t.Helper()
		cur, err := copies.Get(ctx, p.GetName(), metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		cur.Object["spec"] = p.Object["spec"]
		if _, err := copies.Update(ctx, cur, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	// Dropped from the list: alice is no longer reported.
	update(listPrimary("ws-a", ns, "a-app", "bob", "carol"))
	wait(map[string]string{"ws-a": "bob-creds!,carol-creds"})

	// One item without a name: the whole list is unresolved (positions
	// would shift).
	bad := listPrimary("ws-a", ns, "a-app", "carol")
	bad.Object["spec"].(map[string]any)["users"] = append(bad.Object["spec"].(map[string]any)["users"].([]any), map[string]any{"nick": "x"})
	update(bad)
	wait(map[string]string{"ws-a": "unresolved: on the service cluster's copy acc-list/a-app: related \"users\": object.reference: spec.users.#.name: item 1*"})

	// Another primary naming carol too: neither gets her Secret.
	update(listPrimary("ws-a", ns, "a-app", "carol"))
	wait(map[string]string{"ws-a": "carol-creds"})
	if _, err := copies.Create(ctx, listPrimary("ws-b", ns, "b-app", "carol", "dave"), metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	wait(map[string]string{"ws-a": "conflict", "ws-b": "conflict"})
	update(listPrimary("ws-b", ns, "b-app", "dave"))
	wait(map[string]string{"ws-a": "carol-creds", "ws-b": "dave-creds!"})
}
