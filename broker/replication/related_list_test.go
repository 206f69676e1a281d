package replication

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"

	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
	ferryv1alpha1 "github.com/ferry-dev/ferry/api/v1alpha1"
	"github.com/ferry-dev/ferry/pkg/naming"
	"github.com/ferry-dev/ferry/pkg/related"
)

// eventMessage is the message of the primary's Event of reason ("" when
// none).
func eventMessage(t *testing.T, e *env, reason string) string {
	t.Helper()
	list, err := e.kcp.Resource(eventsGVR).Namespace("ns").List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, ev := range list.Items {
		if ev.Object["reason"] == reason {
			return fmt.Sprint(ev.Object["message"])
		}
	}
	return ""
}

// TestListReferenceIsWrittenByPosition: the items a list reference names
// on the service cluster's copy are written to the names the same list
// gives on the kcp object, matched by position; an item whose object is
// gone and an item dropped from the list lose their copies; lists of
// different lengths are refused with an Event and delete nothing; a
// report of one object for a list entry is refused.
func TestListReferenceIsWrittenByPosition(t *testing.T) {
	refs, err := related.Compile([]ferryv1alpha1.RelatedResourceSpec{{
		Identifier: "certs", Origin: ferryv1alpha1.OriginService, Resource: "secrets", Version: "v1", Kind: "Secret",
		Object: &ferryv1alpha1.RelatedResourceObject{RelatedResourceObjectSpec: ferryv1alpha1.RelatedResourceObjectSpec{
			Reference: &ferryv1alpha1.RelatedResourceObjectReference{Path: "spec.users.#.name"},
		}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	users := func(names ...string) map[string]any {
		items := []any{}
		for _, n := range names {
			items = append(items, map[string]any{"name": n})
		}
		return map[string]any{"users": items}
	}
	res := thingsResource()
	res.Related = refs
	e := newEnv(t, res, thing("1", users("alice", "bob", "carol"), nil))
	ctx := context.Background()
	secrets := e.kcp.Resource(schema.GroupVersionResource{Version: "v1", Resource: "secrets"}).Namespace("ns")
	// report sends the edge's list: "name" an object holding data k=name,
	// "name!" one that does not exist.
	report := func(items ...string) error {
		set := &ferryv1.RelatedObjectSet{}
		for _, n := range items {
			if name, gone := strings.CutSuffix(n, "!"); gone {
				set.Entries = append(set.Entries, &ferryv1.RelatedObjectSetEntry{LocalName: "local-" + name, Gone: true})
				continue
			}
			set.Entries = append(set.Entries, &ferryv1.RelatedObjectSetEntry{LocalName: "local-" + n, Object: []byte(`{"data":{"k":"` + n + `"}}`)})
		}
		return e.m.WriteRelated(ctx, "pr", &ferryv1.RelatedObjectReport{
			RelatedTo: &ferryv1.RelatedTo{Primary: thingKey(), Identifier: "certs"},
			State:     &ferryv1.RelatedObjectReport_Objects{Objects: set},
		})
	}
	// copies lists the copies as name=content.
	copies := func() []string {
		list, err := secrets.List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		var out []string
		for _, s := range list.Items {
			if s.GetLabels()[naming.LabelRelatedTo] != "u-a" || s.GetLabels()[naming.LabelRelatedIdentifier] != "certs" {
				t.Errorf("%s is not labelled as the primary's copy: %v", s.GetName(), s.GetLabels())
			}
			out = append(out, s.GetName()+"="+fmt.Sprint(s.Object["data"].(map[string]any)["k"]))
		}
		slices.Sort(out)
		return out
	}
	// The local names differ from kcp's: position decides.
	if err := report("a", "b", "c"); err != nil {
		t.Fatal(err)
	}
	if got := copies(); !slices.Equal(got, []string{"alice=a", "bob=b", "carol=c"}) {
		t.Fatalf("copies %v", got)
	}
	waitWatched(t, e, 3)

	// bob's object is gone on the service cluster: his copy goes.
	if err := report("a", "b!", "c"); err != nil {
		t.Fatal(err)
	}
	if got := copies(); !slices.Equal(got, []string{"alice=a", "carol=c"}) {
		t.Fatalf("copies %v", got)
	}
	waitWatched(t, e, 2)

	// The kcp object drops carol, the service cluster's copy does not yet:
	// nothing moves, and the Event says why.
	e.changed(thing("2", users("alice", "bob"), nil))
	if err := report("a", "b!", "c"); err != nil {
		t.Fatal(err)
	}
	if got := copies(); !slices.Equal(got, []string{"alice=a", "carol=c"}) {
		t.Fatalf("copies after a count mismatch %v", got)
	}
	if msg := eventMessage(t, e, "RelatedUnresolved"); !strings.Contains(msg, "the list names 2 objects on this object but 3 on its copy in the service cluster") {
		t.Errorf("RelatedUnresolved Event: %q", msg)
	}
	// The copy catches up: carol's copy goes.
	if err := report("a", "b"); err != nil {
		t.Fatal(err)
	}
	if got := copies(); !slices.Equal(got, []string{"alice=a", "bob=b"}) {
		t.Fatalf("copies %v", got)
	}

	// One object for a list entry is refused.
	err = e.m.WriteRelated(ctx, "pr", &ferryv1.RelatedObjectReport{
		RelatedTo: &ferryv1.RelatedTo{Primary: thingKey(), Identifier: "certs"},
		State:     &ferryv1.RelatedObjectReport_Object{Object: []byte(`{}`)},
	})
	if !errors.Is(err, ErrRefused) {
		t.Errorf("a single object for a list entry: %v", err)
	}
}
