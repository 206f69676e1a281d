package replication

import (
	"context"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"

	ferryv1alpha1 "github.com/ferry-dev/ferry/api/v1alpha1"
	"github.com/ferry-dev/ferry/pkg/naming"
)

// DeleteCopies deletes this agent's local copies of the objects of remote
// (the kcp resource of a withdrawn PublishedResource, policy Delete) in
// local, its CRD's resource, and the kcp-origin related copies ferry wrote
// for them, and tells how many copies still exist (deleting ones included:
// they may wait for finalizers of their own). It lists by ferry's labels,
// one list per kind, and is called until nothing remains; the
// PublishedResource must be unregistered first, so that no copy is repaired
// meanwhile.
//
// Only copies labelled with remote are deleted: not the copies of another
// kcp resource on the same CRD (another PublishedResource's, or an earlier
// one's deleted with Orphan), and not copies an earlier version of ferry
// made and never adopted, which do not record their kcp resource
// (identity.go); those are logged and left. A related copy is deleted only
// when its primary (by the kcp UID it names) is one of the copies deleted.
func (e *Engine) DeleteCopies(ctx context.Context, remote schema.GroupResource, local schema.GroupVersionResource, related []Related) (remaining int, err error) {
	// One list of the primary copies: their UIDs select the related copies
	// to delete, and they are deleted after those.
	primaries, err := e.listLabelled(ctx, local, naming.CopySelector(e.opts.Agent, remote))
	if err != nil {
		return 0, err
	}
	uids := map[string]bool{}
	for _, u := range primaries {
		if uid := u.GetAnnotations()[naming.AnnotationUID]; uid != "" {
			uids[uid] = true
		}
	}
	for _, r := range related {
		if r.Origin != ferryv1alpha1.OriginKCP {
			continue
		}
		copies, err := e.listLabelled(ctx, r.Local, naming.LabelAgent+"="+e.opts.Agent+","+naming.LabelRelatedIdentifier+"="+r.Identifier)
		if err != nil {
			return 0, err
		}
		n, err := e.deleteListed(ctx, r.Local, copies, func(u *unstructured.Unstructured) bool { return uids[u.GetLabels()[naming.LabelRelatedTo]] })
		if err != nil {
			return 0, err
		}
		remaining += n
	}
	n, err := e.deleteListed(ctx, local, primaries, func(*unstructured.Unstructured) bool { return true })
	if err != nil {
		return 0, err
	}
	if remaining+n == 0 {
		e.logLegacyLeft(ctx, local)
	}
	return remaining + n, nil
}

// logLegacyLeft logs the copies of local an earlier version of ferry made
// that DeleteCopies leaves (they do not record their kcp resource).
func (e *Engine) logLegacyLeft(ctx context.Context, local schema.GroupVersionResource) {
	left, err := e.listLabelled(ctx, local, naming.LegacyCopySelector(e.opts.Agent))
	if err != nil || len(left) == 0 {
		return
	}
	e.opts.Log.Info("deletionPolicy Delete leaves the local copies an earlier version of ferry made and did not adopt: they do not record their kcp resource; "+
		"remove them by hand if they are no longer wanted", "resource", local.String(), "copies", len(left),
		"selector", naming.LegacyCopySelector(e.opts.Agent))
}

// listLabelled lists the objects of gvr that selector matches.
func (e *Engine) listLabelled(ctx context.Context, gvr schema.GroupVersionResource, selector string) ([]unstructured.Unstructured, error) {
	list, err := e.opts.Dynamic.Resource(gvr).List(ctx, metav1.ListOptions{LabelSelector: selector})
	if err != nil {
		return nil, fmt.Errorf("cannot list local %s: %w", gvr, err)
	}
	return list.Items, nil
}

// deleteListed deletes the listed objects of gvr that ours matches and
// returns how many it found (deleting ones included).
func (e *Engine) deleteListed(ctx context.Context, gvr schema.GroupVersionResource, items []unstructured.Unstructured, ours func(*unstructured.Unstructured) bool) (int, error) {
	policy := metav1.DeletePropagationBackground
	found := 0
	for i := range items {
		u := &items[i]
		if !ours(u) {
			continue
		}
		found++
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
	return found, nil
}
