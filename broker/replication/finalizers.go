package replication

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/kcp-dev/logicalcluster/v3"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/dynamic"
)

// ClientFor returns a dynamic client for one logical cluster of an
// APIExport's virtual workspace ("*" for all of them).
type ClientFor func(cluster string) (dynamic.Interface, error)

// ListFinalized lists, across every workspace bound to the export, the
// objects of gvr that carry finalizer: a paged list, not one per object.
func ListFinalized(ctx context.Context, clients ClientFor, gvr schema.GroupVersionResource, finalizer string) ([]unstructured.Unstructured, error) {
	all, err := clients("*")
	if err != nil {
		return nil, err
	}
	var objs []unstructured.Unstructured
	opts := metav1.ListOptions{Limit: 500}
	for {
		list, err := all.Resource(gvr).List(ctx, opts)
		if err != nil {
			return nil, fmt.Errorf("cannot list %s in kcp: %w", gvr, err)
		}
		for _, o := range list.Items {
			if slices.Contains(o.GetFinalizers(), finalizer) {
				o.SetManagedFields(nil)
				objs = append(objs, o)
			}
		}
		if opts.Continue = list.GetContinue(); opts.Continue == "" {
			return objs, nil
		}
	}
}

// RemoveFinalizer removes finalizer from obj (an object of gvr in logical
// cluster cluster; "" takes it from obj's kcp.io/cluster annotation, as
// objects listed through /clusters/* carry it), guarded by its uid and
// resourceVersion so a concurrent change is never overwritten (a conflict
// is returned and the caller retries with a fresh object). A missing object
// is fine.
func RemoveFinalizer(ctx context.Context, clients ClientFor, cluster string, gvr schema.GroupVersionResource, obj *unstructured.Unstructured, finalizer string) error {
	if !slices.Contains(obj.GetFinalizers(), finalizer) {
		return nil
	}
	if cluster == "" {
		cluster = logicalcluster.From(obj).String()
	}
	c, err := clients(cluster)
	if err != nil {
		return err
	}
	return patchFinalizers(ctx, c.Resource(gvr).Namespace(obj.GetNamespace()), obj,
		slices.DeleteFunc(slices.Clone(obj.GetFinalizers()), func(f string) bool { return f == finalizer }))
}

// patchFinalizers sets the finalizer list, guarded by the resourceVersion
// so a concurrent change is never overwritten.
func patchFinalizers(ctx context.Context, ri dynamic.ResourceInterface, obj *unstructured.Unstructured, finalizers []string) error {
	patch, err := json.Marshal(map[string]any{"metadata": map[string]any{
		"finalizers": finalizers, "resourceVersion": obj.GetResourceVersion(), "uid": obj.GetUID(),
	}})
	if err != nil {
		return err
	}
	_, err = ri.Patch(ctx, obj.GetName(), types.MergePatchType, patch, metav1.PatchOptions{})
	if objectGone(err, obj.GetName()) {
		return nil
	}
	return notServedIsTransient(err)
}

// objectGone tells whether err is kcp saying that the object name does not
// exist. A 404 that does not name it ("the server could not find the
// requested resource") means the resource is not served (yet): kcp's
// virtual workspace right after a restart.
func objectGone(err error, name string) bool {
	var st apierrors.APIStatus
	if !apierrors.IsNotFound(err) || !errors.As(err, &st) {
		return false
	}
	d := st.Status().Details
	return d != nil && d.Name == name && !strings.HasPrefix(st.Status().Message, resourceNotServedMessage)
}

// resourceNotServedMessage is the API server's 404 for a path it does not
// serve (client-go also uses it for a 404 without a Status body).
const resourceNotServedMessage = "the server could not find the requested resource"

// notServedIsTransient turns a 404 that does not name the object (the
// resource is not served yet) into an error that does not read as
// NotFound, which callers take as final; other errors pass unchanged.
func notServedIsTransient(err error) error {
	var st apierrors.APIStatus
	if apierrors.IsNotFound(err) && errors.As(err, &st) && (st.Status().Details == nil || st.Status().Details.Name == "" ||
		strings.HasPrefix(st.Status().Message, resourceNotServedMessage)) {
		return fmt.Errorf("kcp does not serve the resource at the moment (retrying): %s", err.Error())
	}
	return err
}

// processNextFinalizer writes the next queued finalizer (blocking until
// there is one); false once the queue is shut down.
func (m *Manager) processNextFinalizer(ctx context.Context) bool {
	return m.processNextOf(m.finalizers, "writing the finalizer failed; retrying", func(it item) error { return m.writeFinalizer(ctx, it) })
}

// writeFinalizer puts the broker's finalizer on the cached object behind
// it unless it carries it already, is being deleted, is out of scope, or
// its PublishedResource is withdrawn or gone. One patch, no read: it is
// guarded by the cached object's resourceVersion and UID, so a stale cache
// costs a conflict (retried; the newer object's event queues it again),
// never a finalizer on an object that changed meanwhile (e.g. began its
// deletion, or left the filters).
//
// The same patch removes the finalizer of a sync agent whose copy the edge
// adopted (adoption.go).
func (m *Manager) writeFinalizer(ctx context.Context, it item) error {
	s, ok, err := m.objectState(it)
	if err != nil || !ok || s.obj == nil {
		return err
	}
	return m.writeFinalizers(ctx, s)
}
