package replication

import (
	"context"
	"fmt"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	utiljson "k8s.io/apimachinery/pkg/util/json"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	clienttesting "k8s.io/client-go/testing"

	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
)

func TestCompileServiceOwned(t *testing.T) {
	for _, tc := range []struct {
		paths []string
		err   string
	}{
		{paths: []string{"spec.replicas", ".spec.autoscaling.min", "data"}},
		{paths: []string{"spec..replicas"}, err: "empty segment"},
		{paths: []string{""}, err: "empty path"},
		{paths: []string{"metadata.labels"}, err: "metadata cannot be owned by the service cluster"},
		{paths: []string{"status"}, err: "status cannot be owned"},
		{paths: []string{"spec.x", "kind"}, err: "spec.serviceOwnedPaths[1]: kind cannot"},
		{paths: []string{"spec.ports.0.port"}, err: "indexes into a list"},
	} {
		t.Run(strings.Join(tc.paths, ","), func(t *testing.T) {
			got, err := CompileServiceOwned(tc.paths)
			switch {
			case tc.err == "" && err != nil:
				t.Fatal(err)
			case tc.err == "" && len(got) != len(tc.paths):
				t.Fatalf("%d paths compiled of %d", len(got), len(tc.paths))
			case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
				t.Fatalf("error %v, want one containing %q", err, tc.err)
			}
		})
	}
}

// applyWrite is one server-side apply the fake cluster saw.
type applyWrite struct {
	manager string
	body    map[string]any
}

// mergeApplies makes the fake service cluster keep server-side applies by
// merging each into the stored object (fields left out stay: the fake
// knows no field ownership) and records them in order.
func mergeApplies(t *testing.T, e *Engine) *[]applyWrite {
	t.Helper()
	var writes []applyWrite
	fake := e.opts.Dynamic.(*dynamicfake.FakeDynamicClient)
	fake.PrependReactor("patch", localGVR.Resource, func(a clienttesting.Action) (bool, runtime.Object, error) {
		pa := a.(clienttesting.PatchActionImpl)
		if pa.GetPatchType() != types.ApplyPatchType {
			return false, nil, nil
		}
		body := map[string]any{}
		if err := utiljson.Unmarshal(pa.GetPatch(), &body); err != nil {
			return true, nil, err
		}
		writes = append(writes, applyWrite{manager: pa.PatchOptions.FieldManager, body: body})
		raw, err := fake.Tracker().Get(localGVR, a.GetNamespace(), pa.GetName())
		if err != nil {
			u := &unstructured.Unstructured{Object: runtime.DeepCopyJSON(body)}
			u.SetNamespace(a.GetNamespace())
			u.SetUID("local-uid")
			return true, u, fake.Tracker().Create(localGVR, u, a.GetNamespace())
		}
		u := raw.(*unstructured.Unstructured).DeepCopy()
		mergeInto(u.Object, runtime.DeepCopyJSON(body))
		return true, u, fake.Tracker().Update(localGVR, u, a.GetNamespace())
	})
	return &writes
}

func mergeInto(dst, src map[string]any) {
	for k, v := range src {
		if sm, ok := v.(map[string]any); ok {
			if dm, ok := dst[k].(map[string]any); ok {
				mergeInto(dm, sm)
				continue
			}
		}
		dst[k] = v
	}
}

// TestServiceOwnedPaths: a service-owned path is set from kcp when the
// copy is created, handed over to ServiceOwnedFieldManager, and never
// applied by the edge's manager again: kcp's later changes do not reach
// the copy, and a local change stays.
func TestServiceOwnedPaths(t *testing.T) {
	key, _ := remoteThing()
	e, w, sink := testEngineWith(t, engineSetup{published: func(p *Published) {
		p.ServiceOwned, _ = CompileServiceOwned([]string{"spec.replicas"})
	}})
	writes := mergeApplies(t, e)
	ctx := context.Background()
	upsert := func(seq int, spec string) (ns, name string) {
		t.Helper()
		e.Handle(&ferryv1.SyncIntent{Key: key, Version: &ferryv1.ObjectVersion{Sequence: uint64(seq)}, PublishedResource: "pr",
			Operation: &ferryv1.SyncIntent_Upsert{Upsert: &ferryv1.UpsertIntent{ContentHash: fmt.Sprintf("h%d", seq),
				Object: []byte(`{"apiVersion":"kcp.example/v1","kind":"Thing","metadata":{"name":"a","namespace":"team"},"spec":` + spec + `}`)}}})
		runQueue(t, e)
		res := sink.msgs[len(sink.msgs)-1].GetIntentResult()
		if res.GetError() != nil {
			t.Fatalf("upsert %d: %v", seq, res.GetError())
		}
		return res.GetLocalNamespace(), res.GetLocalName()
	}
	spec := func(ns, name string) map[string]any {
		t.Helper()
		u, err := e.opts.Dynamic.Resource(localGVR).Namespace(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			t.Fatal(err)
		}
		s, _, _ := unstructured.NestedMap(u.Object, "spec")
		return s
	}
	hasReplicas := func(wr applyWrite) bool {
		_, found, _ := unstructured.NestedFieldNoCopy(wr.body, "spec", "replicas")
		return found
	}

	// Creation: the edge applies kcp's value, hands it over, lets go.
	ns, name := upsert(1, `{"replicas":3,"size":"s"}`)
	if got := spec(ns, name); fmt.Sprint(got) != "map[replicas:3 size:s]" {
		t.Fatalf("created copy's spec = %v", got)
	}
	if len(*writes) != 3 {
		t.Fatalf("%d applies at creation, want 3 (create, hand-over, let go)", len(*writes))
	}
	first, hand, last := (*writes)[0], (*writes)[1], (*writes)[2]
	if first.manager != FieldManager || !hasReplicas(first) {
		t.Errorf("creation: %s applied %v", first.manager, first.body)
	}
	if hand.manager != ServiceOwnedFieldManager || !hasReplicas(hand) || hand.body["spec"].(map[string]any)["size"] != nil {
		t.Errorf("hand-over: %s applied %v, want only spec.replicas", hand.manager, hand.body)
	}
	if ann, _, _ := unstructured.NestedString(hand.body, "metadata", "annotations", AnnotationServiceOwned); ann != "spec.replicas" {
		t.Errorf("hand-over annotation %q", ann)
	}
	if last.manager != FieldManager || hasReplicas(last) {
		t.Errorf("after the hand-over: %s applied %v, want no spec.replicas", last.manager, last.body)
	}

	// A local change (an autoscaler's) stays; kcp's changes do not reach
	// the copy; other fields still sync.
	u, _ := e.opts.Dynamic.Resource(localGVR).Namespace(ns).Get(ctx, name, metav1.GetOptions{})
	_ = unstructured.SetNestedField(u.Object, int64(5), "spec", "replicas")
	u.SetGeneration(u.GetGeneration() + 1)
	if _, err := e.opts.Dynamic.Resource(localGVR).Namespace(ns).Update(ctx, u, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, func() (bool, string) {
		got, ok, _ := w.store.GetByKey(ns + "/" + name)
		return ok && got.(*unstructured.Unstructured).GetGeneration() == u.GetGeneration(), "the cache has not seen the change"
	})
	*writes = nil
	upsert(2, `{"replicas":7,"size":"m"}`)
	if got := spec(ns, name); fmt.Sprint(got) != "map[replicas:5 size:m]" {
		t.Errorf("after kcp changed replicas and size: spec = %v, want replicas 5 (local) and size m", got)
	}
	if len(*writes) != 1 || hasReplicas((*writes)[0]) {
		t.Errorf("want one apply without spec.replicas, got %v", *writes)
	}
}

// TestServiceOwnedPathsOnExistingCopies: a copy made before its path was
// service-owned is handed over with its own value before the edge's
// manager leaves the path out; a path no longer service-owned is applied
// by the edge again, and then let go by the hand-over.
func TestServiceOwnedPathsOnExistingCopies(t *testing.T) {
	key, remote := remoteThing()
	copy := localCopy(remote)
	copy.SetUID("local-uid")
	_ = unstructured.SetNestedField(copy.Object, int64(4), "spec", "replicas")
	e, _, sink := testEngineWith(t, engineSetup{published: func(p *Published) {
		p.ServiceOwned, _ = CompileServiceOwned([]string{"spec.replicas"})
	}}, copy)
	writes := mergeApplies(t, e)
	e.Handle(&ferryv1.SyncIntent{Key: key, Version: &ferryv1.ObjectVersion{Sequence: 1}, PublishedResource: "pr",
		Operation: &ferryv1.SyncIntent_Upsert{Upsert: &ferryv1.UpsertIntent{ContentHash: "h1",
			Object: []byte(`{"apiVersion":"kcp.example/v1","kind":"Thing","metadata":{"name":"a","namespace":"team"},"spec":{"replicas":9}}`)}}})
	runQueue(t, e)
	if err := sink.msgs[len(sink.msgs)-1].GetIntentResult().GetError(); err != nil {
		t.Fatal(err)
	}
	if len(*writes) != 2 {
		t.Fatalf("%d applies, want 2 (hand-over, apply)", len(*writes))
	}
	hand, apply := (*writes)[0], (*writes)[1]
	if v, _, _ := unstructured.NestedInt64(hand.body, "spec", "replicas"); hand.manager != ServiceOwnedFieldManager || v != 4 {
		t.Errorf("hand-over: %s applied %v, want the copy's own spec.replicas 4", hand.manager, hand.body)
	}
	if _, found, _ := unstructured.NestedFieldNoCopy(apply.body, "spec", "replicas"); apply.manager != FieldManager || found {
		t.Errorf("apply: %s applied %v, want no spec.replicas", apply.manager, apply.body)
	}
}
