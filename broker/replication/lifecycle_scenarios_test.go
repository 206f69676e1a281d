package replication

import (
	"context"
	"errors"
	"slices"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	k8stesting "k8s.io/client-go/testing"

	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
	ferryv1alpha1 "github.com/ferry-dev/ferry/api/v1alpha1"
	"github.com/ferry-dev/ferry/pkg/naming"
	"github.com/ferry-dev/ferry/pkg/related"
)

// Scenarios of issue 18 ("What is wrong" 4 and 8) on the broker: records
// about an object must follow the object's identity (its UID) and the
// PublishedResource's lifecycle, and deletions must flow while the
// PublishedResource is withdrawn.

// edgeTakes takes the next intent from the outbox (sent to the edge) and
// fails when there is none.
func edgeTakes(t *testing.T, intents *Intents) *ferryv1.SyncIntent {
	t.Helper()
	in := intents.Next()
	if in == nil {
		t.Fatal("no intent queued")
	}
	return in
}

// edgeAcks answers in like the edge does, and tells the manager when it
// was an applied upsert (as the engine does).
func edgeAcks(t *testing.T, m *Manager, intents *Intents, in *ferryv1.SyncIntent) {
	t.Helper()
	answered := intents.Done(in.GetKey(), nil, in.GetVersion())
	if answered == nil {
		t.Fatalf("the answer to %v is stale", in)
	}
	if answered.GetUpsert() != nil {
		m.Applied(in.GetPublishedResource(), answered)
	}
}

// queued returns every intent the edge can take now, acking none.
func queued(intents *Intents) []*ferryv1.SyncIntent {
	var out []*ferryv1.SyncIntent
	for in := intents.Next(); in != nil; in = intents.Next() {
		out = append(out, in)
	}
	return out
}

func describe(ins []*ferryv1.SyncIntent) []string {
	var out []string
	for _, in := range ins {
		op := "upsert"
		if in.GetDelete() != nil {
			op = "delete"
		}
		out = append(out, op+" "+in.GetKey().GetName()+"@"+in.GetKey().GetUid())
	}
	return out
}

// TestFilterFlipFlopKeepsTheCopy (issue 18, 4a): an object relabelled out
// of filter.resource and back before the edge answered the delete must end
// with its copy sent again; before, the applied hash still said the edge
// had it, and the copy the delete removed was never recreated.
func TestFilterFlipFlopKeepsTheCopy(t *testing.T) {
	team := map[string]string{"team": "a"}
	spec := map[string]any{"size": int64(1)}
	for _, tc := range []struct {
		name string
		// ackUpsert: the edge applied the first upsert before the relabel.
		ackUpsert bool
	}{
		{name: "upsert applied, delete in flight", ackUpsert: true},
		{name: "upsert in flight, delete queued", ackUpsert: false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			obj := withLabels(thing("1", spec, nil), team)
			res := thingsResource()
			res.Selector = labels.SelectorFromSet(team)
			e := newEnv(t, res, obj)
			m, intents := e.m, e.intents
			drain(t, m)
			up := edgeTakes(t, intents)
			if tc.ackUpsert {
				edgeAcks(t, m, intents, up)
			}

			e.changed(thing("2", spec, nil)) // out of the filter
			drain(t, m)
			var del *ferryv1.SyncIntent
			if tc.ackUpsert {
				del = edgeTakes(t, intents) // in flight at the edge
				if del.GetDelete() == nil {
					t.Fatalf("want a delete, got %v", del)
				}
			}
			e.changed(withLabels(thing("3", spec, nil), team)) // back in
			drain(t, m)

			// The edge answers what it had; it deleted the copy if it took
			// the delete.
			if del != nil {
				edgeAcks(t, m, intents, del)
			} else {
				edgeAcks(t, m, intents, up)
			}
			var last *ferryv1.SyncIntent
			for in := intents.Next(); in != nil; in = intents.Next() {
				last = in
				edgeAcks(t, m, intents, in)
			}
			if last.GetUpsert() == nil || last.GetUpsert().GetContentHash() != hashOf(t, obj) {
				t.Fatalf("the last intent is %v; want the object's upsert (its copy is gone otherwise)", last)
			}
		})
	}
}

// TestRecreatedWithTheSameManifest (issue 18, 4c): an object that left kcp
// without a confirmed deletion (kubernetes#77988) and is recreated with the
// same manifest is a new object (new UID): the copy of the old one is
// deleted first (the edge finds copies by name), then the new one is sent.
// Before, the equal hash said "applied", nothing was sent, and the delete
// for the old UID removed the only copy.
func TestRecreatedWithTheSameManifest(t *testing.T) {
	spec := map[string]any{"size": int64(1)}
	for _, tc := range []struct {
		name string
		// seenGone: the watch saw the old object go before the new one
		// came; otherwise the watch sees the name change UID.
		seenGone bool
	}{
		{name: "watch saw it gone, then the new object", seenGone: true},
		{name: "watch saw the UID change", seenGone: false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			old := thing("1", spec, nil)
			e := newEnv(t, thingsResource(), old)
			m, intents := e.m, e.intents
			recreated := thing("5", spec, nil)
			recreated.SetUID("u-b")

			drain(t, m)
			edgeAcks(t, m, intents, edgeTakes(t, intents))

			if tc.seenGone {
				e.gone(old)
				drain(t, m)
			}
			e.changed(recreated) // seen as a new UID at the name unless seen gone
			drain(t, m)
			got := queued(intents)
			if d := describe(got); !slices.Equal(d, []string{"delete a@u-a"}) {
				t.Fatalf("before the old copy's deletion is confirmed: intents %v, want only the delete of the old copy", d)
			}
			edgeAcks(t, m, intents, got[0])
			if err := m.Release(context.Background(), "pr", got[0].GetKey()); err != nil {
				t.Fatalf("the edge's confirmation for the old UID: %v", err)
			}
			drain(t, m)
			got = queued(intents)
			if d := describe(got); !slices.Equal(d, []string{"upsert a@u-b"}) {
				t.Fatalf("after the old copy is gone: intents %v, want the new object's upsert", d)
			}
			edgeAcks(t, m, intents, got[0])
			e.touch("a")
			drain(t, m)
			if more := describe(queued(intents)); len(more) != 0 {
				t.Fatalf("sent again after the edge applied it: %v", more)
			}
		})
	}
}

func namedThing(name string, spec map[string]any) *unstructured.Unstructured {
	u := thing("1", spec, nil)
	u.SetName(name)
	u.SetUID(types.UID("u-" + name))
	return u
}

func finalizersInKCP(t *testing.T, client *dynamicfake.FakeDynamicClient, name string) []string {
	t.Helper()
	got, err := client.Resource(thingsGVR).Namespace("ns").Get(context.Background(), name, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	return got.GetFinalizers()
}

// TestWithdrawnAndRepublished (issue 18, 4b): a PublishedResource briefly
// withdrawn (invalid) and published again re-sends its objects (copies may
// have been deleted meanwhile) and finishes the deletions that were under
// way. Before, the hashes queued before the withdrawal said "sent", so
// nothing was, until the next reconnect.
func TestWithdrawnAndRepublished(t *testing.T) {
	spec := map[string]any{"size": int64(1)}
	synced := namedThing("synced", spec)
	terminating := deleting(namedThing("terminating", spec))
	e := newEnv(t, thingsResource(), synced, terminating)
	drain(t, e.m)
	m, intents, client := e.m, e.intents, e.kcp.FakeDynamicClient
	for _, in := range queued(intents) {
		edgeAcks(t, m, intents, in)
	}

	m.Withdraw("pr")
	// The edge's confirmation of the deletion comes while withdrawn (it
	// may be refused; then the delete must be asked for again).
	_ = m.Release(context.Background(), "pr", keyOf("terminating", "u-terminating"))
	e.ensure(thingsResource())
	drain(t, m)

	got := describe(queued(intents))
	if !slices.Contains(got, "upsert synced@u-synced") {
		t.Errorf("after republishing: intents %v; want the synced object sent again", got)
	}
	released := !slices.Contains(finalizersInKCP(t, client, "terminating"), "ferry.dev/nora")
	if !released && !slices.Contains(got, "delete terminating@u-terminating") {
		t.Errorf("after republishing: the terminating object keeps the finalizer and no delete is asked for (intents %v)", got)
	}
}

// TestDeletionsFlowWhileWithdrawn (issue 18, 8): while a PublishedResource
// is withdrawn (e.g. invalid), objects deleted in kcp still get their copy
// deleted and their finalizer released; nothing new is synced. Before, the
// watch stopped and the objects stayed Terminating.
func TestDeletionsFlowWhileWithdrawn(t *testing.T) {
	spec := map[string]any{"size": int64(1)}
	a := namedThing("a", spec)
	e := newEnv(t, thingsResource(), a)
	drain(t, e.m)
	m, intents, client := e.m, e.intents, e.kcp.FakeDynamicClient
	for _, in := range queued(intents) {
		edgeAcks(t, m, intents, in)
	}
	m.Withdraw("pr")

	ctx := context.Background()
	live, err := client.Resource(thingsGVR).Namespace("ns").Get(ctx, "a", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := client.Resource(thingsGVR).Namespace("ns").Update(ctx, deleting(live), metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	fresh := withoutFinalizer(namedThing("fresh", spec))
	if _, err := client.Resource(thingsGVR).Namespace("ns").Create(ctx, fresh, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	var del *ferryv1.SyncIntent
	eventually(t, "a delete intent for the object deleted in kcp", func() bool {
		drain(t, m)
		for _, in := range queued(intents) {
			if in.GetDelete() != nil && in.GetKey().GetName() == "a" {
				del = in
			} else {
				t.Errorf("while withdrawn: unexpected intent %v", describe([]*ferryv1.SyncIntent{in}))
			}
		}
		return del != nil
	})
	edgeAcks(t, m, intents, del)
	if err := m.Release(ctx, "pr", del.GetKey()); err != nil {
		t.Fatalf("the edge's confirmation while withdrawn: %v", err)
	}
	if f := finalizersInKCP(t, client, "a"); slices.Contains(f, "ferry.dev/nora") {
		t.Fatalf("finalizer not released while withdrawn: %v", f)
	}
	drain(t, m)
	if f := finalizersInKCP(t, client, "fresh"); len(f) != 0 {
		t.Errorf("a finalizer was added while withdrawn: %v", f)
	}
}

// TestReleaseWaitsBoundedForUnlistedRelatedKind (issue 18, 8): a
// service-origin related kind whose watch never lists (e.g. a claim kcp
// refuses) delays the release of a deleted primary by a bounded wait, then
// the copies are found by a live list (or, when that fails too, the
// finalizer is released with a warning). Before, every release of the
// resource failed until the watch listed, forever.
func TestReleaseWaitsBoundedForUnlistedRelatedKind(t *testing.T) {
	refs, err := related.Compile([]ferryv1alpha1.RelatedResourceSpec{{
		Identifier: "tls", Origin: ferryv1alpha1.OriginService, Kind: "Secret",
		Reference: &ferryv1alpha1.RelatedResourceReference{Name: ferryv1alpha1.ResourceLocator{Path: "spec.secretName"}},
	}})
	if err != nil {
		t.Fatal(err)
	}
	secret := &unstructured.Unstructured{Object: map[string]any{"apiVersion": "v1", "kind": "Secret"}}
	secret.SetNamespace("ns")
	secret.SetName("a-tls")
	secret.SetUID("u-secret")
	secret.SetLabels(map[string]string{naming.LabelRelatedTo: "u-a", naming.LabelRelatedIdentifier: "tls"})
	for _, tc := range []struct {
		name string
		// wait is Options.RelatedListWait (the related watch never lists).
		wait         time.Duration
		listRefused  bool
		wantReleased bool
		wantSecret   bool
	}{
		{name: "within the wait: retried", wait: time.Hour, wantReleased: false, wantSecret: true},
		{name: "past the wait: copies found by a live list", wait: time.Nanosecond, wantReleased: true, wantSecret: false},
		{name: "past the wait, the list is refused too: released with a warning", wait: time.Nanosecond, listRefused: true,
			wantReleased: true, wantSecret: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			primary := deleting(thing("1", map[string]any{"secretName": "a-tls"}, nil))
			k := newFakeKCP(primary, secret)
			// The related watch (selecting every related copy) never
			// lists; a live list of one object's copies may.
			k.PrependReactor("list", "secrets", func(a k8stesting.Action) (bool, runtime.Object, error) {
				watchList := a.(k8stesting.ListAction).GetListRestrictions().Labels.String() == naming.LabelRelatedTo
				if watchList || tc.listRefused {
					return true, nil, apierrors.NewForbidden(schema.GroupResource{Resource: "secrets"}, "", errors.New("no claim"))
				}
				return false, nil, nil
			})
			res := thingsResource()
			res.Related = refs
			e := startEnv(t, k, res, func(o *Options) { o.RelatedListWait = tc.wait })
			e.waitWatches(true, false)
			m, client := e.m, k.FakeDynamicClient

			err := m.Release(context.Background(), "pr", thingKey())
			if released := err == nil; released != tc.wantReleased {
				t.Fatalf("release: %v; want released %v", err, tc.wantReleased)
			}
			if has := slices.Contains(finalizersInKCP(t, client, "a"), "ferry.dev/nora"); has == tc.wantReleased {
				t.Errorf("finalizer in kcp %v, want released %v", has, tc.wantReleased)
			}
			_, err = client.Resource(secretsGVR).Namespace("ns").Get(context.Background(), "a-tls", metav1.GetOptions{})
			if exists := err == nil; exists != tc.wantSecret {
				t.Errorf("related copy exists %v, want %v", exists, tc.wantSecret)
			}
			if m.relatedListed(secretsGVR) {
				t.Fatal("the related watch listed: the test does not test the wait")
			}
		})
	}
}
