package replication

import (
	"context"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"

	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
	"github.com/ferry-dev/ferry/pkg/naming"
)

// Ownership before writing: the copies ferry manages are often real things
// (a database, a bucket), so the edge writes a copy only where nothing
// exists yet or where ferry's own copy of the same kcp object is. Anything
// else at the name the naming rules give (an object the service owner made,
// another workspace's copy when the rules map two workspaces onto one name)
// is refused with a final CONFLICT that shows on the kcp object.

// isCopyOf tells whether u is ferry's copy of remote: its labels and
// annotations name the same workspace, namespace and name (a copy of an
// earlier kcp object of that name, with another UID, is taken over by the
// object that replaced it), or, when its labels were mangled, its
// annotations carry remote's UID (kcp UIDs are unique) and name.
func isCopyOf(u *unstructured.Unstructured, remote naming.Remote) bool {
	if r, ok := naming.RemoteFrom(u.GetLabels(), u.GetAnnotations()); ok {
		return r.ClusterName == remote.ClusterName && r.Namespace == remote.Namespace && r.Name == remote.Name
	}
	ann := u.GetAnnotations()
	return remote.UID != "" && ann[naming.AnnotationUID] == remote.UID &&
		ann[naming.AnnotationNamespace] == remote.Namespace && ann[naming.AnnotationName] == remote.Name
}

// sameObject tells whether a copy was made for exactly key's object: a copy
// that names another UID belongs to an object that replaced key's (same
// name, deleted and created again), or to one it replaced.
func sameObject(u *unstructured.Unstructured, key *ferryv1.ObjectKey) bool {
	uid := u.GetAnnotations()[naming.AnnotationUID]
	return uid != "" && uid == key.GetUid()
}

// claim checks the place a new copy of remote goes (ns/name, which the local
// watch does not show a copy of remote at): it returns a refusal when
// something that is not ferry's copy of remote is there, a copy of an
// object of another kcp resource included.
func (e *Engine) claim(ctx context.Context, pub *Published, ns, name string, remote naming.Remote) (uid types.UID, refusal string, err error) {
	got, err := e.opts.Dynamic.Resource(pub.Local).Namespace(ns).Get(ctx, name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return "", "", nil
	case err != nil:
		return "", "", fmt.Errorf("cannot read %s %s: %w", pub.LocalKind, nsName(ns, name), err)
	case isCopyOf(got, remote) && ofResource(got, pub, remote.UID):
		return got.GetUID(), "", nil
	}
	if other := got.GetLabels()[naming.LabelRemoteResource]; other != "" && other != pub.resourceLabel() {
		return "", fmt.Sprintf("%s %s in the service cluster is ferry's copy of an object of another kcp resource (%s=%s); "+
			"ferry does not overwrite another resource's copy (change spec.naming of PublishedResource %s)",
			pub.LocalKind, nsName(ns, name), naming.LabelRemoteResource, other, pub.Name), nil
	}
	if _, labelled := got.GetLabels()[naming.LabelRemoteResource]; !labelled && isCopyOf(got, remote) {
		return "", fmt.Sprintf("%s %s in the service cluster was made by an earlier version of ferry for an object of this name with "+
			"another kcp UID (%s), and does not record its kcp resource; ferry does not overwrite it (remove it there if it "+
			"is no longer wanted)", pub.LocalKind, nsName(ns, name), got.GetAnnotations()[naming.AnnotationUID]), nil
	}
	if r, ok := naming.RemoteFrom(got.GetLabels(), got.GetAnnotations()); ok {
		return "", fmt.Sprintf("%s %s in the service cluster is the copy of %s %s in workspace %s; spec.naming of PublishedResource %s "+
			"maps both objects onto one local name, and ferry does not overwrite another object's copy",
			pub.LocalKind, nsName(ns, name), pub.LocalKind, nsName(r.Namespace, r.Name), r.ClusterName, pub.Name), nil
	}
	return "", fmt.Sprintf("%s %s already exists in the service cluster and was not created by ferry; ferry does not overwrite it "+
		"(rename or remove it there, or change spec.naming of PublishedResource %s)", pub.LocalKind, nsName(ns, name), pub.Name), nil
}
