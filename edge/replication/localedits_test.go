package replication

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	clienttesting "k8s.io/client-go/testing"

	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
	"github.com/ferry-dev/ferry/pkg/fieldpath"
	"github.com/ferry-dev/ferry/pkg/naming"
)

// storeWrites is storeApplies plus JSON patches that remove fields (the
// edge's removal of fields kcp removed under localEdits Keep).
func storeWrites(t *testing.T, e *Engine) {
	t.Helper()
	storeApplies(t, e)
	fake := e.opts.Dynamic.(*dynamicfake.FakeDynamicClient)
	fake.PrependReactor("patch", localGVR.Resource, func(a clienttesting.Action) (bool, runtime.Object, error) {
		pa := a.(clienttesting.PatchAction)
		if pa.GetPatchType() != types.JSONPatchType {
			return false, nil, nil
		}
		var ops []struct{ Op, Path string }
		if err := json.Unmarshal(pa.GetPatch(), &ops); err != nil {
			return true, nil, err
		}
		raw, err := fake.Tracker().Get(localGVR, a.GetNamespace(), pa.GetName())
		if err != nil {
			return true, nil, err
		}
		u := raw.(*unstructured.Unstructured).DeepCopy()
		for _, op := range ops {
			if op.Op == "remove" {
				if err := fieldpath.Path(strings.Split(strings.TrimPrefix(op.Path, "/"), "/")).Delete(u.Object); err != nil {
					return true, nil, err
				}
			}
		}
		return true, u, fake.Tracker().Update(localGVR, u, a.GetNamespace())
	})
}

// TestLocalEdits drives one copy through kcp changes and local edits under
// both policies: Repair (kcp wins at once) and Keep (a local edit survives
// until kcp changes that field; a field kcp removes is removed even where it
// was edited).
func TestLocalEdits(t *testing.T) {
	type step struct {
		// kcp is the kcp object's spec sent (nil: no upsert).
		kcp map[string]any
		// edit changes the copy's spec locally before the upsert (a
		// resend follows, as for every drift).
		edit func(spec map[string]any)
		// want is the copy's spec after the step.
		want map[string]any
	}
	edit := func(f string, v any) func(map[string]any) { return func(s map[string]any) { s[f] = v } }
	for _, tc := range []struct {
		name  string
		keep  bool
		steps []step
	}{
		{name: "Repair: a local edit is undone by the next apply", steps: []step{
			{kcp: map[string]any{"x": "a", "y": "b"}, want: map[string]any{"x": "a", "y": "b"}},
			{edit: edit("x", "local"), kcp: map[string]any{"x": "a", "y": "b"}, want: map[string]any{"x": "a", "y": "b"}},
		}},
		{name: "Keep: a local edit survives a resend and an unrelated kcp change, then kcp's change of the field wins", keep: true, steps: []step{
			{kcp: map[string]any{"x": "a", "y": "b"}, want: map[string]any{"x": "a", "y": "b"}},
			{edit: edit("x", "local"), kcp: map[string]any{"x": "a", "y": "b"}, want: map[string]any{"x": "local", "y": "b"}},
			{kcp: map[string]any{"x": "a", "y": "c"}, want: map[string]any{"x": "local", "y": "c"}},
			{kcp: map[string]any{"x": "z", "y": "c"}, want: map[string]any{"x": "z", "y": "c"}},
		}},
		{name: "Keep: a field kcp removes is removed even where it was edited", keep: true, steps: []step{
			{kcp: map[string]any{"x": "a", "y": "b"}, want: map[string]any{"x": "a", "y": "b"}},
			{edit: edit("y", "local"), kcp: map[string]any{"x": "a", "y": "b"}, want: map[string]any{"x": "a", "y": "local"}},
			{kcp: map[string]any{"x": "a"}, want: map[string]any{"x": "a"}},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			key, _ := remoteThing()
			e, w, sink := testEngineWith(t, engineSetup{published: func(p *Published) { p.KeepLocalEdits = tc.keep }})
			storeWrites(t, e)
			ctx := context.Background()
			var ns, name string
			for i, st := range tc.steps {
				if st.edit != nil {
					u, err := e.opts.Dynamic.Resource(localGVR).Namespace(ns).Get(ctx, name, metav1.GetOptions{})
					if err != nil {
						t.Fatal(err)
					}
					spec, _, _ := unstructured.NestedMap(u.Object, "spec")
					st.edit(spec)
					_ = unstructured.SetNestedMap(u.Object, spec, "spec")
					u.SetGeneration(u.GetGeneration() + 1)
					if _, err := e.opts.Dynamic.Resource(localGVR).Namespace(ns).Update(ctx, u, metav1.UpdateOptions{}); err != nil {
						t.Fatal(err)
					}
					waitFor(t, func() (bool, string) {
						got, ok, _ := w.store.GetByKey(ns + "/" + name)
						return ok && got.(*unstructured.Unstructured).GetGeneration() == u.GetGeneration(), "the cache has not seen the edit"
					})
				}
				obj, _ := json.Marshal(map[string]any{"apiVersion": "kcp.example/v1", "kind": "Thing",
					"metadata": map[string]any{"name": "a", "namespace": "team"}, "spec": st.kcp})
				// A distinct hash per step: each is a new kcp state (or a
				// resend, which the drift asks for and is applied anyway).
				e.Handle(&ferryv1.SyncIntent{Key: key, Version: &ferryv1.ObjectVersion{Sequence: uint64(i + 1)}, PublishedResource: "pr",
					Operation: &ferryv1.SyncIntent_Upsert{Upsert: &ferryv1.UpsertIntent{ContentHash: fmt.Sprintf("h%d", i), Object: obj}}})
				runQueue(t, e)
				res := sink.msgs[len(sink.msgs)-1].GetIntentResult()
				if res.GetError() != nil {
					t.Fatalf("step %d: %v", i, res.GetError())
				}
				ns, name = res.GetLocalNamespace(), res.GetLocalName()
				u, err := e.opts.Dynamic.Resource(localGVR).Namespace(ns).Get(ctx, name, metav1.GetOptions{})
				if err != nil {
					t.Fatal(err)
				}
				spec, _, _ := unstructured.NestedMap(u.Object, "spec")
				if fmt.Sprint(spec) != fmt.Sprint(st.want) {
					t.Errorf("step %d: copy's spec = %v, want %v", i, spec, st.want)
				}
				last, hasLast := u.GetAnnotations()[naming.AnnotationLastApplied]
				if hasLast != tc.keep {
					t.Errorf("step %d: %s annotation present = %v with keep = %v", i, naming.AnnotationLastApplied, hasLast, tc.keep)
				}
				if tc.keep {
					// The base is kcp's state, never the merged one.
					want, _ := json.Marshal(map[string]any{"spec": st.kcp})
					if last != string(want) {
						t.Errorf("step %d: base = %s, want %s", i, last, want)
					}
				}
			}
		})
	}
}

// TestKeepLocalEditsLeavesServiceOwnedPathsOut: a service-owned path is no
// part of the base, so its absence from the desired state (the edge leaves
// it out) is never taken for kcp removing it — even against a base
// recorded before the path became service-owned.
func TestKeepLocalEditsLeavesServiceOwnedPathsOut(t *testing.T) {
	owned, _ := CompileServiceOwned([]string{"spec.replicas"})
	existing := &unstructured.Unstructured{Object: map[string]any{"spec": map[string]any{"replicas": int64(5), "x": "local"}}}
	existing.SetAnnotations(map[string]string{naming.AnnotationLastApplied: `{"spec":{"replicas":3,"x":"a"}}`})
	local := &unstructured.Unstructured{Object: map[string]any{"spec": map[string]any{"x": "a"}}}
	removed, err := keepLocalEdits(local, existing, owned)
	if err != nil {
		t.Fatal(err)
	}
	if len(removed) != 0 {
		t.Errorf("removed = %v, want nothing", removed)
	}
	if got := fmt.Sprint(local.Object["spec"]); got != "map[x:local]" {
		t.Errorf("merged spec = %s, want the kept edit and no replicas", got)
	}
	if got := local.GetAnnotations()[naming.AnnotationLastApplied]; got != `{"spec":{"x":"a"}}` {
		t.Errorf("base = %s", got)
	}
	// A new copy: created with kcp's value, the base without it.
	local = &unstructured.Unstructured{Object: map[string]any{"spec": map[string]any{"x": "a", "replicas": int64(3)}}}
	if _, err := keepLocalEdits(local, nil, owned); err != nil {
		t.Fatal(err)
	}
	if got := local.GetAnnotations()[naming.AnnotationLastApplied]; got != `{"spec":{"x":"a"}}` {
		t.Errorf("base of a new copy = %s", got)
	}
	if r, _, _ := unstructured.NestedInt64(local.Object, "spec", "replicas"); r != 3 {
		t.Errorf("new copy's replicas = %d, want kcp's 3", r)
	}
}

// TestKeepLocalEditsAcrossARestart: the base is on the copy, so an engine
// that did not apply the copy (a restarted edge) keeps an edit made before
// it started, and still applies kcp's changes of other fields.
func TestKeepLocalEditsAcrossARestart(t *testing.T) {
	key, remote := remoteThing()
	copy := localCopy(remote)
	copy.SetUID("local-uid")
	_ = unstructured.SetNestedField(copy.Object, "local", "spec", "x")
	_ = unstructured.SetNestedField(copy.Object, "b", "spec", "y")
	ann := copy.GetAnnotations()
	ann[naming.AnnotationLastApplied] = `{"spec":{"x":"a","y":"b"}}`
	copy.SetAnnotations(ann)
	e, _, sink := testEngineWith(t, engineSetup{published: func(p *Published) { p.KeepLocalEdits = true }}, copy)
	storeWrites(t, e)
	e.Handle(&ferryv1.SyncIntent{Key: key, Version: &ferryv1.ObjectVersion{Sequence: 1}, PublishedResource: "pr",
		Operation: &ferryv1.SyncIntent_Upsert{Upsert: &ferryv1.UpsertIntent{ContentHash: "h2",
			Object: []byte(`{"apiVersion":"kcp.example/v1","kind":"Thing","metadata":{"name":"a","namespace":"team"},"spec":{"x":"a","y":"c"}}`)}}})
	runQueue(t, e)
	if err := sink.msgs[len(sink.msgs)-1].GetIntentResult().GetError(); err != nil {
		t.Fatal(err)
	}
	u, err := e.opts.Dynamic.Resource(localGVR).Namespace(copy.GetNamespace()).Get(context.Background(), copy.GetName(), metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if spec := fmt.Sprint(u.Object["spec"]); spec != "map[x:local y:c]" {
		t.Errorf("spec = %s, want the edit kept and kcp's change of y applied", spec)
	}
}
