package edgelease

import (
	"context"
	"fmt"

	coordinationv1 "k8s.io/api/coordination/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	coordinationv1client "k8s.io/client-go/kubernetes/typed/coordination/v1"
)

// seed is what one List of a workspace's Leases namespace told about the
// Leases of the edges whose initial status was pending when it ran. A
// broker starting sets an initial status per configured edge while it
// remembers no Lease yet: without the seed each costs a read of its Lease
// before its write, 1,000 reads for 1,000 edges; with it, one List per
// workspace.
type seed struct {
	// done is closed when the List returned; the fields below are set
	// then.
	done chan struct{}
	// failed: the List failed, each Lease is read on its own (as without
	// a seed).
	failed bool
	// leases holds, by Lease name, the Lease each edge's first write starts
	// from; nil: the edge had no Lease when listed. An entry is taken by
	// that first write: a later write starts from the Lease it wrote, or
	// reads it.
	leases map[string]*coordinationv1.Lease
}

// seeded tells what the workspace's List said about s's Lease (nil: it had
// none); known is false when s's Lease must be read instead. The first
// initial status of a workspace lists it, the others wait for that List.
func (w *Writer) seeded(ctx context.Context, leases coordinationv1client.LeaseInterface, s Status) (l *coordinationv1.Lease, known bool) {
	ws := s.Edge.APIExport.Workspace
	w.mu.Lock()
	sd, ok := w.seeds[ws]
	if !ok {
		if !s.Initial {
			w.mu.Unlock()
			return nil, false
		}
		sd = &seed{done: make(chan struct{})}
		w.seeds[ws] = sd
		names := w.pendingInitialNames(ws)
		w.mu.Unlock()
		w.list(ctx, leases, ws, names, sd)
	} else {
		w.mu.Unlock()
		select {
		case <-sd.done:
		case <-ctx.Done():
			return nil, false
		}
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if sd.failed {
		return nil, false
	}
	l, known = sd.leases[s.name()]
	delete(sd.leases, s.name())
	return l, known
}

// pendingInitialNames are the Lease names of the initial statuses of
// workspace ws not written yet, for identities without a Lease written.
// Callers hold w.mu.
func (w *Writer) pendingInitialNames(ws string) map[string]bool {
	names := map[string]bool{}
	for key, p := range w.pending {
		if p.status.Initial && p.status.Edge.APIExport.Workspace == ws && w.written[key] == nil {
			names[p.status.name()] = true
		}
	}
	return names
}

// list fills sd from one List of ferry's Leases (by their managed-by
// label) in the namespace, keeping those named in names, and closes
// sd.done. A failed List leaves each Lease to be read on its own.
func (w *Writer) list(ctx context.Context, leases coordinationv1client.LeaseInterface, ws string, names map[string]bool, sd *seed) {
	defer close(sd.done)
	selector := labels.SelectorFromSet(labels.Set{LabelManagedBy: ManagedBy}).String()
	list, err := leases.List(ctx, metav1.ListOptions{LabelSelector: selector})
	if err != nil {
		w.opts.Log.Error(fmt.Errorf("cannot list the edge Leases in %s of workspace %s: %w", w.opts.Namespace, ws, err),
			"reading each edge's Lease on its own instead", "workspace", ws)
		w.mu.Lock()
		sd.failed = true
		w.mu.Unlock()
		return
	}
	w.mu.Lock()
	sd.leases = make(map[string]*coordinationv1.Lease, len(names))
	for name := range names {
		sd.leases[name] = nil
	}
	for i := range list.Items {
		// A copy: the List's other Leases (other brokers', edges no longer
		// configured) are not kept alive by the ones kept.
		if l := &list.Items[i]; names[l.Name] {
			sd.leases[l.Name] = l.DeepCopy()
		}
	}
	w.mu.Unlock()
	w.opts.Log.V(1).Info("listed the edge Leases", "workspace", ws, "leases", len(list.Items), "edges", len(names))
}
