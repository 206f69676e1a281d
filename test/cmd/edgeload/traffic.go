package main

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kcp-dev/logicalcluster/v3"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/rest"

	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
	"github.com/ferry-dev/ferry/test/edgeload"
	"github.com/ferry-dev/ferry/test/framework"
)

const (
	// consumerWorkspace binds every traffic edge's export.
	consumerWorkspace = "edgeload-consumer"
	// objectsPerEdge are the widgets per traffic edge: the generator
	// creates them, then updates them in turn.
	objectsPerEdge = 5
	// widgetNamespace is where the widgets live in the consumer workspace.
	widgetNamespace = "default"
)

// target is one traffic edge's widgets as the consumer sees them.
type target struct {
	resource schema.GroupVersionResource
	kind     string
}

// setupTraffic waits until the broker published every traffic edge's CRD,
// binds their exports, each from its own workspace (exports, by edge
// name), in one consumer workspace (accepting their claims) and waits until
// the consumer is served each resource. It returns the writer of the
// widgets.
func setupTraffic(ctx context.Context, cfg *rest.Config, exports map[string]logicalcluster.Path, edges []*edgeload.Edge, timeout time.Duration) (*writer, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	targets := make([]target, len(edges))
	for i, e := range edges {
		select {
		case <-e.Published():
		case <-ctx.Done():
			r := e.PublishResult()
			return nil, fmt.Errorf("edge %s: its CRD was not published (last result: %s %s: %s)", e.Name(), r.GetState(), r.GetReason(), r.GetMessage())
		}
		r := e.PublishResult()
		sr := r.GetServedResource()
		targets[i] = target{resource: schema.GroupVersionResource{Group: sr.GetGroup(), Version: sr.GetVersion(), Resource: sr.GetResource()}, kind: r.GetProjectedKind()}
	}
	for _, e := range edges {
		if _, ok := exports[e.Name()]; !ok {
			return nil, fmt.Errorf("edge %s: no workspace known for its export", e.Name())
		}
	}
	consumer, err := createWorkspace(ctx, cfg, consumerWorkspace)
	if err != nil {
		return nil, err
	}
	if err := forEach(ctx, len(edges), 4, func(i int) error {
		return framework.BindAPIExport(ctx, cfg, consumer, exports[edges[i].Name()], exportOf(edges[i].Name()))
	}); err != nil {
		return nil, err
	}
	dyn, err := dynamic.NewForConfig(workspaceConfig(cfg, consumer))
	if err != nil {
		return nil, err
	}
	for _, t := range targets {
		ri := dyn.Resource(t.resource).Namespace(widgetNamespace)
		err := framework.Eventually(ctx, time.Minute, 250*time.Millisecond, func(ctx context.Context) (bool, string) {
			if _, err := ri.List(ctx, metav1.ListOptions{Limit: 1}); err != nil {
				return false, err.Error()
			}
			return true, ""
		})
		if err != nil {
			return nil, fmt.Errorf("%s is not served in %s: %w", t.resource, consumer, err)
		}
	}
	return &writer{dyn: dyn, targets: targets}, nil
}

// createWorkspace creates the workspace root:name. A kcp that just
// became ready may still refuse its admin the creation for a few seconds
// (its RBAC bootstrap is not served yet): that is tried again.
func createWorkspace(ctx context.Context, cfg *rest.Config, name string) (logicalcluster.Path, error) {
	var path logicalcluster.Path
	var last error
	err := framework.Eventually(ctx, time.Minute, time.Second, func(ctx context.Context) (bool, string) {
		path, last = framework.CreateWorkspace(ctx, cfg, "root", name)
		if apierrors.IsForbidden(last) {
			return false, last.Error()
		}
		return true, ""
	})
	if err != nil {
		return path, err
	}
	return path, last
}

// workspaceConfig is cfg (any workspace of the server) for the workspace
// at path.
func workspaceConfig(cfg *rest.Config, path logicalcluster.Path) *rest.Config {
	cfg = rest.CopyConfig(cfg)
	base, _, _ := strings.Cut(cfg.Host, "/clusters/")
	cfg.Host = base + "/clusters/" + path.String()
	// The generator paces itself; client-go's default limit (5/s) would
	// pace it instead.
	cfg.QPS, cfg.Burst = -1, 0
	return cfg
}

// forEach runs do(0..n-1) from parallel goroutines and returns the first
// error.
func forEach(ctx context.Context, n, parallel int, do func(i int) error) error {
	var (
		next  atomic.Int64
		wg    sync.WaitGroup
		mu    sync.Mutex
		first error
	)
	for range parallel {
		wg.Go(func() {
			for {
				i := int(next.Add(1)) - 1
				if i >= n || ctx.Err() != nil {
					return
				}
				if err := do(i); err != nil {
					mu.Lock()
					if first == nil {
						first = err
					}
					mu.Unlock()
					return
				}
			}
		})
	}
	wg.Wait()
	return first
}

// writer creates and updates widgets in the consumer workspace, one write
// at a time at a fixed rate, across the traffic edges in turn: the first
// round creates objectsPerEdge widgets per edge, later ones update them.
// Each write stamps its start time into the widget (edgeload.Widget), which
// the edge that receives the intent reads.
type writer struct {
	dyn     dynamic.Interface
	targets []target
	// step is the next write's number (only run's goroutine).
	step int64

	writes, errors atomic.Int64
}

// run writes rate objects per second until ctx ends.
func (w *writer) run(ctx context.Context, rate float64) {
	t := time.NewTicker(time.Duration(float64(time.Second) / rate))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		err := w.write(ctx)
		if ctx.Err() != nil {
			return // cut short by the window's end: not counted
		}
		if err != nil {
			w.errors.Add(1)
		}
		w.writes.Add(1)
	}
}

// write creates or updates the step's widget.
func (w *writer) write(ctx context.Context) error {
	n := int64(len(w.targets))
	edge, slot, round := w.step%n, (w.step/n)%objectsPerEdge, w.step/(n*objectsPerEdge)
	w.step++
	t := w.targets[edge]
	ri := w.dyn.Resource(t.resource).Namespace(widgetNamespace)
	name := fmt.Sprintf("w-%d", slot)
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	if round == 0 {
		_, err := ri.Create(ctx, edgeload.Widget(t.resource, t.kind, widgetNamespace, name, round, time.Now()), metav1.CreateOptions{})
		return err
	}
	_, err := ri.Patch(ctx, name, types.MergePatchType, edgeload.WidgetPatch(round, time.Now()), metav1.PatchOptions{})
	return err
}

// counts are the writes so far and how many failed.
func (w *writer) counts() (writes, errors int64) { return w.writes.Load(), w.errors.Load() }

// publishFor is the Publish of traffic edge i (nil for i >= traffic).
func publishFor(i, traffic int) (*ferryv1.Publish, error) {
	if i >= traffic {
		return nil, nil
	}
	return edgeload.WidgetPublish(exportName(i))
}
