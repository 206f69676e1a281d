package replication

import (
	"context"
	"errors"
	"fmt"
	"slices"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/tools/cache"

	ferryv1alpha1 "github.com/ferry-dev/ferry/api/v1alpha1"
	"github.com/ferry-dev/ferry/pkg/naming"
	"github.com/ferry-dev/ferry/pkg/watching"
)

// Where the edge may write: tenant containment.
//
// The broker names the workspace (logical cluster) of every intent, and the
// kcp consumer writes the spec that related references are evaluated on;
// neither may choose where the edge writes. A workspace's objects land only
//   - in namespaces ferry created for that workspace (labelled
//     ferry.dev/workspace=<logical cluster>, and ferry.dev/agent),
//   - in a namespace the PublishedResource names statically (a naming rule
//     without placeholders, a related entry's static namespace), or
//   - for primary copies, in an existing namespace ferry did not create when
//     spec.naming.allowExistingNamespaces says so.
//
// A namespace ferry created for another workspace is refused in every case.

// errForbidden wraps every placement refusal.
var errForbidden = errors.New("forbidden")

var namespacesGVR = schema.GroupVersionResource{Version: "v1", Resource: "namespaces"}

// nsState is what the edge knows of a namespace.
type nsState int

const (
	nsMissing  nsState = iota // does not exist (as far as the edge knows)
	nsFerry                   // created by ferry (for a workspace, or shared by this agent)
	nsExisting                // exists, not created by this agent
)

// placement is where a workspace's object may land.
type placement struct {
	// workspace is the object's logical cluster.
	workspace string
	// static are namespaces the PublishedResource names statically.
	static []string
	// allowExisting admits namespaces ferry did not create.
	allowExisting bool
	// primary: the placement of a primary copy, which
	// spec.naming.allowExistingNamespaces can widen (not a related object).
	primary bool
}

// decide tells whether an object of p.workspace may land in ns, which is in
// state st (for nsFerry, created for workspace owner), and with which
// workspace label the edge creates ns when it is missing ("" for a static,
// shared namespace).
func (p placement) decide(ns string, st nsState, owner string) (label string, err error) {
	static := slices.Contains(p.static, ns)
	switch {
	case st == nsFerry && owner != "" && owner != p.workspace:
		return "", fmt.Errorf("%w: namespace %s belongs to another workspace", errForbidden, ns)
	case st == nsFerry && owner == p.workspace:
		return p.workspace, nil
	case static:
		return "", nil
	case st == nsMissing:
		return p.workspace, nil
	case st == nsFerry:
		return "", fmt.Errorf("%w: namespace %s is shared by all workspaces and this PublishedResource does not name it", errForbidden, ns)
	case p.allowExisting:
		return "", nil
	case p.primary:
		return "", fmt.Errorf("%w: namespace %s exists and was not created by ferry for this workspace (set spec.naming.allowExistingNamespaces to allow it)", errForbidden, ns)
	default:
		return "", fmt.Errorf("%w: namespace %s exists and was not created by ferry for this workspace", errForbidden, ns)
	}
}

// watchNamespacesLocked starts the informer on the namespaces ferry
// created for a workspace (selected by the label: no other namespace is
// cached). Not by agent name: an edge renamed since keeps its namespaces,
// and a workspace's namespace is that workspace's whichever edge made it.
func (e *Engine) watchNamespacesLocked() {
	lw := watching.ListWatch(e.opts.Dynamic.Resource(namespacesGVR), naming.LabelWorkspace)
	informer := cache.NewSharedIndexInformer(lw, &unstructured.Unstructured{}, 0, cache.Indexers{})
	_ = informer.SetTransform(dropManagedFields)
	// Related objects are cached in ferry's namespaces (relatedwatch.go).
	changed := func(any) {
		e.mu.Lock()
		defer e.mu.Unlock()
		if e.nsSynced {
			e.ensureRelatedWatchesLocked()
		}
	}
	_, _ = informer.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc: changed, DeleteFunc: changed, UpdateFunc: func(_, obj any) { changed(obj) },
	})
	e.nsStore = informer.GetIndexer()
	go informer.RunWithContext(e.ctx)
	go func() {
		if cache.WaitForCacheSync(e.ctx.Done(), informer.HasSynced) {
			e.mu.Lock()
			e.nsSynced = true
			e.ensureRelatedWatchesLocked()
			e.mu.Unlock()
			e.relistRelated()
		}
	}()
}

// namespaceLocked tells what the edge knows of ns without a request.
func (e *Engine) namespaceLocked(ns string) (nsState, string) {
	if owner, ok := e.created[ns]; ok {
		return nsFerry, owner
	}
	if e.foreign[ns] {
		return nsExisting, ""
	}
	if e.nsStore != nil {
		if raw, ok, _ := e.nsStore.GetByKey(ns); ok {
			return nsFerry, raw.(*unstructured.Unstructured).GetLabels()[naming.LabelWorkspace]
		}
	}
	return nsMissing, ""
}

// mayRelateLocked tells whether a related object of a primary of workspace
// may be read or written in ns: the primary's own namespace (placed by the
// same rules), a namespace the entry names statically, or a namespace the
// edge created for the same workspace. A namespace that does not exist is
// refused as such, except for a kcp-origin entry that derives it from the
// primary's namespace when that namespace is one ferry created for the
// workspace: then create tells the caller to create ns for the workspace
// (api-syncagent creates it too; deriving it from ferry's own namespace
// keeps the consumer from choosing which namespaces ferry creates).
func (e *Engine) mayRelateLocked(workspace, primaryNS, ns string, ref *Related) (create bool, err error) {
	if ns == primaryNS && primaryNS != "" {
		return false, nil
	}
	var static []string
	if s, ok := ref.StaticNamespace(); ok {
		static = []string{s}
	}
	st, owner := e.namespaceLocked(ns)
	if st == nsMissing && len(static) == 0 {
		if ref.Origin == ferryv1alpha1.OriginKCP && ref.NamespaceFromPrimaryNamespace() {
			if pst, powner := e.namespaceLocked(primaryNS); pst == nsFerry && powner == workspace {
				return true, nil
			}
			return false, fmt.Errorf("related %q: %w: namespace %s is not one ferry created for this workspace (%s), and ferry creates it only when the primary's namespace (%s) is one it created for this workspace",
				ref.Identifier, errForbidden, ns, notFerrys, primaryNS)
		}
		return false, fmt.Errorf("related %q: %w: namespace %s is not one ferry created for this workspace (%s); ferry creates a related object's namespace only when the entry names it statically "+
			"or, for origin kcp, derives it from the primary's namespace (reference.namespace.path: metadata.namespace)", ref.Identifier, errForbidden, ns, notFerrys)
	}
	if _, err := (placement{workspace: workspace, static: static}).decide(ns, st, owner); err != nil {
		return false, fmt.Errorf("related %q: %w", ref.Identifier, err)
	}
	return false, nil
}

// notFerrys says what the edge knows of a namespace its cache does not hold:
// the cache holds only ferry's namespaces, so it does not exist or the
// service cluster made it.
const notFerrys = "it does not exist, or the service cluster made it"

// place makes sure an object of p.workspace may land in ns and that ns
// exists: it creates a missing namespace labelled for the workspace (or
// for all of them, when static). An existing namespace the informer does
// not hold was not created by this agent.
func (e *Engine) place(ctx context.Context, p placement, ns string) error {
	e.mu.Lock()
	st, owner := e.namespaceLocked(ns)
	e.mu.Unlock()
	label, err := p.decide(ns, st, owner)
	if err != nil || st != nsMissing {
		return err
	}
	labels := map[string]string{naming.LabelAgent: e.opts.Agent}
	if label != "" {
		labels[naming.LabelWorkspace] = label
	}
	_, err = e.opts.Kube.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns, Labels: labels}},
		metav1.CreateOptions{FieldManager: FieldManager})
	switch {
	case apierrors.IsAlreadyExists(err):
		// Someone else's, or ours and not in the informer yet: read it.
		got, getErr := e.opts.Kube.CoreV1().Namespaces().Get(ctx, ns, metav1.GetOptions{})
		if getErr != nil {
			return fmt.Errorf("cannot read namespace %s: %w", ns, getErr)
		}
		st, owner = nsExisting, ""
		if ws := got.Labels[naming.LabelWorkspace]; ws != "" || got.Labels[naming.LabelAgent] == e.opts.Agent {
			st, owner = nsFerry, ws
		}
		e.mu.Lock()
		if st == nsFerry {
			e.created[ns] = owner
		} else {
			e.foreign[ns] = true
		}
		e.mu.Unlock()
		_, err = p.decide(ns, st, owner)
		return err
	case err != nil:
		return fmt.Errorf("cannot create namespace %s: %w", ns, err)
	}
	e.mu.Lock()
	e.created[ns] = label
	e.mu.Unlock()
	return nil
}

// forgetNamespace drops a namespace that turned out to be gone.
func (e *Engine) forgetNamespace(ns string) {
	e.mu.Lock()
	delete(e.created, ns)
	delete(e.foreign, ns)
	e.mu.Unlock()
}

// relistRelated reports the service-origin related objects of every synced
// primary again (once the namespaces are known, refusals can be decided).
func (e *Engine) relistRelated() {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, w := range e.watches {
		if w.synced {
			for _, obj := range w.store.List() {
				e.reportRelatedLocked(w, obj)
			}
		}
	}
}
