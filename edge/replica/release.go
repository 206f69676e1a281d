package replica

import (
	"context"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"

	ferryv1alpha1 "github.com/ferry-dev/ferry/api/v1alpha1"
	"github.com/ferry-dev/ferry/pkg/naming"
)

// DeleteCopies deletes this agent's local copies of local (a withdrawn
// PublishedResource's resource, policy Delete) and the kcp-origin related
// copies ferry wrote for them, and tells how many copies still exist
// (deleting ones included: they may wait for finalizers of their own). It
// lists by ferry's labels, one list per kind, and is called until nothing
// remains; the PublishedResource must be unregistered first, so that no
// copy is repaired meanwhile.
func (e *Engine) DeleteCopies(ctx context.Context, local schema.GroupVersionResource, related []Related) (remaining int, err error) {
	for _, r := range related {
		if r.Origin != ferryv1alpha1.OriginKCP {
			continue
		}
		n, err := e.deleteLabelled(ctx, r.Local, naming.LabelAgent+"="+e.opts.Agent+","+naming.LabelRelatedIdentifier+"="+r.Identifier)
		if err != nil {
			return 0, err
		}
		remaining += n
	}
	n, err := e.deleteLabelled(ctx, local, naming.LabelAgent+"="+e.opts.Agent+","+naming.LabelRemoteCluster)
	if err != nil {
		return 0, err
	}
	return remaining + n, nil
}

// deleteLabelled deletes the objects of gvr that selector matches and
// returns how many it found.
func (e *Engine) deleteLabelled(ctx context.Context, gvr schema.GroupVersionResource, selector string) (int, error) {
	list, err := e.opts.Dynamic.Resource(gvr).List(ctx, metav1.ListOptions{LabelSelector: selector})
	if err != nil {
		return 0, fmt.Errorf("cannot list local %s: %w", gvr, err)
	}
	policy := metav1.DeletePropagationBackground
	for _, u := range list.Items {
		if u.GetDeletionTimestamp() != nil {
			continue
		}
		uid := u.GetUID()
		err := e.opts.Dynamic.Resource(gvr).Namespace(u.GetNamespace()).Delete(ctx, u.GetName(), metav1.DeleteOptions{
			PropagationPolicy: &policy, Preconditions: &metav1.Preconditions{UID: &uid},
		})
		if err != nil && !apierrors.IsNotFound(err) {
			return 0, fmt.Errorf("cannot delete local %s %s: %w", gvr.Resource, nsName(u.GetNamespace(), u.GetName()), err)
		}
		e.opts.Log.Info("deleted a local copy of a withdrawn PublishedResource (deletionPolicy Delete)", "resource", gvr.String(),
			"local", nsName(u.GetNamespace(), u.GetName()))
	}
	return len(list.Items), nil
}
