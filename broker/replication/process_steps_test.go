package replication

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/go-logr/logr"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
)

// The decision steps run over an object state and a ledger, with effects
// that record what they were asked to do: no manager, no kcp.

// stepThing is the object ns/a of cluster c (UID uid) with spec size,
// carrying the broker's finalizer when finalized.
func stepThing(uid string, size int64, finalized bool) *unstructured.Unstructured {
	u := &unstructured.Unstructured{Object: map[string]any{
		"apiVersion": "g/v1", "kind": "Thing",
		"metadata": map[string]any{
			"name": "a", "namespace": "ns", "uid": uid, "resourceVersion": "7",
			"annotations": map[string]any{"kcp.io/cluster": "c"},
		},
		"spec": map[string]any{"size": size},
	}}
	if finalized {
		u.SetFinalizers([]string{"ferry.dev/nora"})
	}
	return u
}

// deletingThing is stepThing being deleted in kcp.
func deletingThing(uid string, finalized bool) *unstructured.Unstructured {
	u := stepThing(uid, 1, finalized)
	u.SetDeletionTimestamp(&metav1.Time{Time: time.Unix(1, 0)})
	return u
}

// stepKey is the protocol key of stepThing(uid, …).
func stepKey(uid string) *ferryv1.ObjectKey {
	return &ferryv1.ObjectKey{Cluster: "c", Resource: &ferryv1.GroupVersionResource{Group: "g", Version: "v1", Resource: "things"},
		Namespace: "ns", Name: "a", Uid: uid}
}

// desiredHash is the content hash the steps compute for obj.
func desiredHash(t *testing.T, obj *unstructured.Unstructured) string {
	t.Helper()
	d := &decision{objectState: objectState{it: item{pr: "pr", key: "c|ns/a"}, res: thingsResource(), obj: obj}}
	if _, err := stepDesiredState(context.Background(), d, &stepEffects{}); err != nil {
		t.Fatal(err)
	}
	return d.upsert.GetContentHash()
}

// recordingEffects are effects that record what the steps do, in order,
// and whether the ledger's lock is held where it has to be.
func recordingEffects(t *testing.T, l *ledger, wsPath func(context.Context, string) (string, error)) (*stepEffects, *[]string) {
	var got []string
	locked := false
	add := func(needLock bool, e string) {
		if locked != needLock {
			t.Errorf("effect %q called with the ledger's lock held=%v", e, locked)
		}
		got = append(got, e)
	}
	return &stepEffects{
		withLedger: func(f func(*ledger)) {
			if locked {
				t.Fatal("withLedger called with the ledger's lock held")
			}
			locked = true
			defer func() { locked = false }()
			f(l)
		},
		put: func(in *ferryv1.SyncIntent) {
			op := "upsert"
			switch {
			case in.GetDelete().GetOrphan():
				op = "orphan"
			case in.GetDelete() != nil:
				op = "delete"
			}
			add(false, "put "+op+" "+in.GetKey().GetUid())
		},
		drop:                func(key *ferryv1.ObjectKey) { add(false, "drop "+key.GetUid()) },
		queueFinalizer:      func(item) { add(false, "finalizer") },
		queueRelated:        func(item) { add(true, "related") },
		queueServiceRelated: func(item) { add(false, "serviceRelated") },
		resynced:            func(_ item, unchanged bool) { add(true, fmt.Sprintf("resynced unchanged=%v", unchanged)) },
		forgetResync:        func(item) { add(true, "forgetResync") },
		workspacePath:       wsPath,
		warn: func(_ context.Context, _ string, key *ferryv1.ObjectKey, reason, _ string) {
			add(false, "warn "+reason+" "+key.GetUid())
		},
		log: logr.Discard(),
	}, &got
}

// annotated is obj with the consumer's deletion policy annotation.
func annotated(obj *unstructured.Unstructured, policy string) *unstructured.Unstructured {
	ann := obj.GetAnnotations()
	ann["ferry.dev/deletion-policy"] = policy
	obj.SetAnnotations(ann)
	return obj
}

// allowOrphan is a PublishedResource with spec.consumerDeletionPolicy Allow.
func allowOrphan(s *objectState) { s.res.ConsumerOrphan = true }

func TestProcessSteps(t *testing.T) {
	idOfUID := func(uid string) objectID { return idOf("pr", stepKey(uid)) }
	// ledger setups, through the ledger's transitions
	// sentAndApplied: the edge holds size 1.
	sentAndApplied := func(t *testing.T, l *ledger, _ *unstructured.Unstructured) {
		h := desiredHash(t, stepThing("u-a", 1, true))
		l.upsertQueued(idOfUID("u-a"), stepKey("u-a"), h)
		l.acked(idOfUID("u-a"), stepKey("u-a"), h)
	}
	copyOf := func(uid string) func(*testing.T, *ledger, *unstructured.Unstructured) {
		return func(_ *testing.T, l *ledger, _ *unstructured.Unstructured) {
			l.upsertQueued(idOfUID(uid), stepKey(uid), "h-old")
		}
	}
	deleteQueued := func(_ *testing.T, l *ledger, _ *unstructured.Unstructured) {
		l.upsertQueued(idOfUID("u-a"), stepKey("u-a"), "h-old")
		l.deleteQueued(idOfUID("u-a"), stepKey("u-a"))
	}
	rejected := func(t *testing.T, l *ledger, obj *unstructured.Unstructured) {
		l.upsertQueued(idOfUID("u-a"), stepKey("u-a"), desiredHash(t, obj))
		l.rejectedFinal(idOfUID("u-a"), stepKey("u-a"))
		l.streamAttached()
	}
	inScopeThing := stepThing("u-a", 1, true)

	cases := []struct {
		name string
		// obj is the cached object (nil: gone from the cache).
		obj *unstructured.Unstructured
		// state adjusts the state: by default the watch listed, the
		// resource is open, published, and obj in scope.
		state  func(*objectState)
		ledger func(*testing.T, *ledger, *unstructured.Unstructured)
		// wsErr fails the workspace path lookup (WorkspacePaths on).
		wsErr bool

		wantStep    string
		wantEffects []string
		// anyOrder: the effects' order is not defined (copies of several
		// objects).
		anyOrder bool
		wantErr  bool
	}{
		// gone
		{name: "gone without a copy", wantStep: "gone", wantEffects: []string{"forgetResync"}},
		{name: "gone with a copy: its delete", ledger: copyOf("u-a"), wantStep: "gone",
			wantEffects: []string{"forgetResync", "put delete u-a"}},
		{name: "gone with copies of two objects at its name", ledger: func(t *testing.T, l *ledger, o *unstructured.Unstructured) {
			copyOf("u-a")(t, l, o)
			copyOf("u-b")(t, l, o)
		}, wantStep: "gone", wantEffects: []string{"forgetResync", "put delete u-a", "put delete u-b"}, anyOrder: true},
		{name: "gone, its delete queued already", ledger: deleteQueued, wantStep: "gone", wantEffects: []string{"forgetResync"}},
		{name: "gone before the watch listed: maybe not listed yet", ledger: copyOf("u-a"),
			state: func(s *objectState) { s.listed = false }, wantStep: "gone", wantEffects: []string{"forgetResync"}},
		{name: "gone while held until the inventory", ledger: copyOf("u-a"),
			state: func(s *objectState) { s.open = false }, wantStep: "gone", wantEffects: []string{"forgetResync"}},

		// finalizer wanted, then held until the inventory
		{name: "new object without the finalizer, held", obj: stepThing("u-a", 1, false), state: func(s *objectState) { s.open = false },
			wantStep: "heldUntilInventory", wantEffects: []string{"finalizer"}},
		{name: "new object with the finalizer, held", obj: inScopeThing, state: func(s *objectState) { s.open = false },
			wantStep: "heldUntilInventory"},
		{name: "no finalizer while withdrawn", obj: stepThing("u-a", 1, false), state: func(s *objectState) { s.withdrawn = true },
			wantStep: "withdrawn"},
		{name: "no finalizer for an object being deleted", obj: deletingThing("u-a", false), wantStep: "notSynced"},
		{name: "no finalizer out of scope", obj: stepThing("u-a", 1, false), state: func(s *objectState) { s.scope = outOfScope },
			wantStep: "notSynced"},
		{name: "no finalizer while the namespace is unknown", obj: stepThing("u-a", 1, false),
			state: func(s *objectState) { s.scope = scopeUnknown }, wantStep: "notSynced"},
		{name: "new object without the finalizer: finalizer and upsert", obj: stepThing("u-a", 1, false),
			wantStep: "serviceRelated", wantEffects: []string{"finalizer", "resynced unchanged=false", "put upsert u-a", "serviceRelated"}},

		// delete asked
		{name: "deleted with the finalizer", obj: deletingThing("u-a", true), wantStep: "deleteAsked",
			wantEffects: []string{"put delete u-a"}},
		{name: "deleted without the finalizer, copy sent", obj: deletingThing("u-a", false), ledger: copyOf("u-a"),
			wantStep: "deleteAsked", wantEffects: []string{"put delete u-a"}},
		{name: "deleted without the finalizer, another object's copy only: not this one's", obj: deletingThing("u-a", false),
			ledger: copyOf("u-old"), wantStep: "notSynced"},
		{name: "deleted, delete queued already", obj: deletingThing("u-a", true), ledger: deleteQueued, wantStep: "deleteAsked"},
		{name: "deleted, an older object's copy goes too", obj: deletingThing("u-a", true), ledger: copyOf("u-old"),
			wantStep: "deleteAsked", wantEffects: []string{"put delete u-old", "put delete u-a"}},
		{name: "deleted and out of scope", obj: deletingThing("u-a", true), state: func(s *objectState) { s.scope = outOfScope },
			wantStep: "deleteAsked", wantEffects: []string{"put delete u-a"}},
		{name: "out of scope with the finalizer", obj: inScopeThing, state: func(s *objectState) { s.scope = outOfScope },
			wantStep: "deleteAsked", wantEffects: []string{"put delete u-a"}},
		{name: "namespace unknown with the finalizer: nothing", obj: inScopeThing,
			state: func(s *objectState) { s.scope = scopeUnknown }, wantStep: "notSynced"},
		{name: "withdrawn and deleted: the delete still flows", obj: deletingThing("u-a", true),
			state: func(s *objectState) { s.withdrawn = true }, wantStep: "deleteAsked", wantEffects: []string{"put delete u-a"}},
		{name: "withdrawn and out of scope: the delete still flows", obj: inScopeThing,
			state: func(s *objectState) { s.withdrawn = true; s.scope = outOfScope }, wantStep: "deleteAsked",
			wantEffects: []string{"put delete u-a"}},
		// the consumer's deletion policy (ferry.dev/deletion-policy)
		{name: "deleted with Orphan, allowed: the copy is orphaned", obj: annotated(deletingThing("u-a", true), "Orphan"),
			state: allowOrphan, wantStep: "deleteAsked", wantEffects: []string{"put orphan u-a"}},
		{name: "deleted with Orphan, not allowed: deleted, and the consumer is told", obj: annotated(deletingThing("u-a", true), "Orphan"),
			wantStep: "deleteAsked", wantEffects: []string{"warn DeletionPolicyIgnored u-a", "put delete u-a"}},
		{name: "deleted with an unknown policy, allowed: deleted, and the consumer is told", obj: annotated(deletingThing("u-a", true), "orphan"),
			state: allowOrphan, wantStep: "deleteAsked", wantEffects: []string{"warn DeletionPolicyIgnored u-a", "put delete u-a"}},
		{name: "out of scope with Orphan, allowed: the copy is deleted (only a deletion in kcp counts)", obj: annotated(stepThing("u-a", 1, true), "Orphan"),
			state: func(s *objectState) { allowOrphan(s); s.scope = outOfScope }, wantStep: "deleteAsked", wantEffects: []string{"put delete u-a"}},
		{name: "deleted with Orphan, delete queued already: no second Event", obj: annotated(deletingThing("u-a", true), "Orphan"),
			ledger: deleteQueued, wantStep: "deleteAsked"},
		{name: "deleted but held until the inventory", obj: deletingThing("u-a", true), state: func(s *objectState) { s.open = false },
			wantStep: "heldUntilInventory"},

		// withdrawn
		{name: "withdrawn, in scope: nothing new", obj: inScopeThing, state: func(s *objectState) { s.withdrawn = true },
			wantStep: "withdrawn"},

		// desired state
		{name: "workspace path unknown: an error, retried", obj: inScopeThing, wsErr: true,
			state: func(s *objectState) { s.res.WorkspacePaths = true }, wantStep: "desiredState", wantErr: true},

		// older copies first
		{name: "recreated at its name: the older copy goes first", obj: inScopeThing, ledger: copyOf("u-old"),
			wantStep: "olderCopiesFirst", wantEffects: []string{"put delete u-old"}},
		{name: "recreated, older copy's delete queued already: still waits", obj: inScopeThing,
			ledger: func(t *testing.T, l *ledger, o *unstructured.Unstructured) {
				copyOf("u-old")(t, l, o)
				l.deleteQueued(idOfUID("u-old"), stepKey("u-old"))
			}, wantStep: "olderCopiesFirst"},

		// upsert unchanged / changed, related
		{name: "unchanged: drop, related compared again", obj: inScopeThing, ledger: sentAndApplied,
			wantStep: "upsertUnchanged", wantEffects: []string{"related", "resynced unchanged=true", "drop u-a"}},
		{name: "changed: upsert and service-origin related", obj: stepThing("u-a", 2, true), ledger: sentAndApplied,
			wantStep: "serviceRelated", wantEffects: []string{"resynced unchanged=false", "put upsert u-a", "serviceRelated"}},
		{name: "changed, queued already: not put again", obj: inScopeThing,
			ledger: func(t *testing.T, l *ledger, o *unstructured.Unstructured) {
				l.upsertQueued(idOfUID("u-a"), stepKey("u-a"), desiredHash(t, o))
			}, wantStep: "serviceRelated", wantEffects: []string{"resynced unchanged=false", "serviceRelated"}},
		{name: "refused for good: not sent again", obj: inScopeThing, ledger: rejected,
			wantStep: "serviceRelated", wantEffects: []string{"resynced unchanged=false", "serviceRelated"}},
		{name: "back in scope before the edge answered a delete: sent again", obj: inScopeThing, ledger: deleteQueued,
			wantStep: "serviceRelated", wantEffects: []string{"resynced unchanged=false", "put upsert u-a", "serviceRelated"}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			l := newLedger()
			if tc.ledger != nil {
				tc.ledger(t, l, tc.obj)
			}
			s := objectState{it: item{pr: "pr", key: "c|ns/a"}, res: thingsResource(), obj: tc.obj, listed: true, open: true, scope: inScope}
			if tc.obj != nil {
				s.hasFinalizer = slices.Contains(tc.obj.GetFinalizers(), "ferry.dev/nora")
			}
			if tc.state != nil {
				tc.state(&s)
			}
			ws := func(context.Context, string) (string, error) { return "root:team", nil }
			if tc.wsErr {
				ws = func(context.Context, string) (string, error) { return "", errors.New("kcp is down") }
			}
			fx, got := recordingEffects(t, l, ws)
			step, err := decide(context.Background(), s, fx)
			if (err != nil) != tc.wantErr {
				t.Fatalf("error %v, want one: %v", err, tc.wantErr)
			}
			if step != tc.wantStep {
				t.Errorf("ended at step %q, want %q", step, tc.wantStep)
			}
			if tc.anyOrder {
				slices.Sort(*got)
				slices.Sort(tc.wantEffects)
			}
			if !slices.Equal(*got, tc.wantEffects) {
				t.Errorf("effects %q, want %q", *got, tc.wantEffects)
			}
		})
	}
}

// TestProcessStepsUpsertRecordsTheLedger checks what the upsert and
// delete steps leave in the ledger: the next run over the same state
// queues nothing again.
func TestProcessStepsUpsertRecordsTheLedger(t *testing.T) {
	for _, obj := range []*unstructured.Unstructured{stepThing("u-a", 1, true), deletingThing("u-a", true)} {
		l := newLedger()
		s := objectState{it: item{pr: "pr", key: "c|ns/a"}, res: thingsResource(), obj: obj, listed: true, open: true,
			hasFinalizer: true, scope: inScope}
		fx, got := recordingEffects(t, l, nil)
		if _, err := decide(context.Background(), s, fx); err != nil {
			t.Fatal(err)
		}
		first := len(*got)
		if _, err := decide(context.Background(), s, fx); err != nil {
			t.Fatal(err)
		}
		for _, e := range (*got)[first:] {
			if e == "put upsert u-a" || e == "put delete u-a" {
				t.Errorf("deletion=%v: %q again on the second run", obj.GetDeletionTimestamp() != nil, e)
			}
		}
		if obj.GetDeletionTimestamp() == nil && !l.mayHold(idOf("pr", stepKey("u-a"))) {
			t.Errorf("deletion=%v: the ledger does not record that the edge may hold the copy", obj.GetDeletionTimestamp() != nil)
		}
	}
}

// TestProcessStepsOrder pins the order of the steps: the table above
// relies on it (e.g. a deleted object's delete before the scope check,
// the finalizer before the inventory gate).
func TestProcessStepsOrder(t *testing.T) {
	var names []string
	for _, s := range objectSteps() {
		names = append(names, s.name)
	}
	want := []string{"gone", "finalizerWanted", "heldUntilInventory", "deleteAsked", "notSynced", "withdrawn",
		"desiredState", "olderCopiesFirst", "upsertUnchanged", "upsertChanged", "serviceRelated"}
	if !slices.Equal(names, want) {
		t.Errorf("steps %q, want %q", names, want)
	}
}
