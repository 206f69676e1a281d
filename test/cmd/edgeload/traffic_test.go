package main

import (
	"context"
	"fmt"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	clienttesting "k8s.io/client-go/testing"
)

// TestWriterSteps checks the generator's order of writes: the traffic
// edges in turn, the first round creating objectsPerEdge widgets per edge,
// later rounds patching them with the next revision.
func TestWriterSteps(t *testing.T) {
	targets := []target{
		{resource: schema.GroupVersionResource{Group: "a.edgeload.ferry.dev", Version: "v1", Resource: "widgets"}, kind: "Widget"},
		{resource: schema.GroupVersionResource{Group: "b.edgeload.ferry.dev", Version: "v1", Resource: "widgets"}, kind: "Widget"},
	}
	lists := map[schema.GroupVersionResource]string{}
	for _, tg := range targets {
		lists[tg.resource] = "WidgetList"
	}
	dyn := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(), lists)
	w := &writer{dyn: dyn, targets: targets}
	ctx := context.Background()
	steps := 2 * len(targets) * objectsPerEdge // two rounds
	for range steps {
		if err := w.write(ctx); err != nil {
			t.Fatal(err)
		}
	}

	var got []string
	for _, a := range dyn.Actions() {
		switch a := a.(type) {
		case clienttesting.CreateAction:
			got = append(got, fmt.Sprintf("create %s %s", a.GetResource().Group, a.GetObject().(metav1.Object).GetName()))
		case clienttesting.PatchAction:
			got = append(got, fmt.Sprintf("patch %s %s", a.GetResource().Group, a.GetName()))
		}
	}
	want := []string{}
	for _, verb := range []string{"create", "patch"} {
		for slot := range objectsPerEdge {
			for _, tg := range targets {
				want = append(want, fmt.Sprintf("%s %s w-%d", verb, tg.resource.Group, slot))
			}
		}
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("writes\n%v\nwant\n%v", got, want)
	}

	obj, err := dyn.Resource(targets[1].resource).Namespace(widgetNamespace).Get(ctx, "w-4", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	rev, _, _ := unstructured.NestedInt64(obj.Object, "spec", "revision")
	at, _, _ := unstructured.NestedString(obj.Object, "spec", "writtenAt")
	if rev != 1 || at == "" {
		t.Errorf("w-4 after two rounds: revision %d, writtenAt %q; want revision 1 and a time", rev, at)
	}
	if w.step != int64(steps) {
		t.Errorf("step %d; want %d", w.step, steps)
	}
}

// TestWriterRunCounts runs the writer at a rate until its context ends:
// every write is counted, a failing one as an error.
func TestWriterRunCounts(t *testing.T) {
	gvr := schema.GroupVersionResource{Group: "a.edgeload.ferry.dev", Version: "v1", Resource: "widgets"}
	dyn := dynamicfake.NewSimpleDynamicClientWithCustomListKinds(runtime.NewScheme(), map[schema.GroupVersionResource]string{gvr: "WidgetList"})
	dyn.PrependReactor("patch", "widgets", func(clienttesting.Action) (bool, runtime.Object, error) {
		return true, nil, fmt.Errorf("kcp refused")
	})
	w := &writer{dyn: dyn, targets: []target{{resource: gvr, kind: "Widget"}}}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		w.run(ctx, 1000)
	}()
	deadline := time.Now().Add(10 * time.Second)
	for writes, _ := w.counts(); writes < objectsPerEdge+3; writes, _ = w.counts() {
		if time.Now().After(deadline) {
			t.Fatalf("%d writes after 10s at 1000/s", writes)
		}
		time.Sleep(time.Millisecond)
	}
	cancel()
	<-done
	writes, errs := w.counts()
	if errs != writes-objectsPerEdge {
		t.Errorf("%d writes, %d failed; want every patch (all but the %d creates) failed", writes, errs, objectsPerEdge)
	}
}
