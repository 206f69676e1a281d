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
// object of another kcp resource included; or, under conflictPolicy Adopt,
// the object nobody marked as a copy that is taken over (adopt.go).
func (e *Engine) claim(ctx context.Context, pub *Published, ns, name string, remote naming.Remote) (uid types.UID, adopting *adoption, refusal string, err error) {
	got, err := e.opts.Dynamic.Resource(pub.Local).Namespace(ns).Get(ctx, name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return "", nil, "", nil
	case err != nil:
		return "", nil, "", fmt.Errorf("cannot read %s %s: %w", pub.LocalKind, nsName(ns, name), err)
	case isCopyOf(got, remote) && ofResource(got, pub, remote.UID):
		return got.GetUID(), nil, "", nil
	}
	uid, adopting, refusal = claimRefusal(pub, got, ns, name, remote)
	return uid, adopting, refusal, nil
}

// claimRefusal decides on got, found at ns/name, the place of remote's
// copy, which is not ferry's copy of remote: refused, or adopted.
func claimRefusal(pub *Published, got *unstructured.Unstructured, ns, name string, remote naming.Remote) (types.UID, *adoption, string) {
	if other := got.GetLabels()[naming.LabelRemoteResource]; other != "" && other != pub.resourceLabel() {
		return "", nil, fmt.Sprintf("%s %s in the service cluster is ferry's copy of an object of another kcp resource (%s=%s); "+
			"ferry does not overwrite another resource's copy (change spec.naming of PublishedResource %s)",
			pub.LocalKind, nsName(ns, name), naming.LabelRemoteResource, other, pub.Name)
	}
	if _, labelled := got.GetLabels()[naming.LabelRemoteResource]; !labelled && isCopyOf(got, remote) {
		return "", nil, fmt.Sprintf("%s %s in the service cluster was made by an earlier version of ferry for an object of this name with "+
			"another kcp UID (%s), and does not record its kcp resource; ferry does not overwrite it (remove it there if it "+
			"is no longer wanted)", pub.LocalKind, nsName(ns, name), got.GetAnnotations()[naming.AnnotationUID])
	}
	if r, ok := naming.RemoteFrom(got.GetLabels(), got.GetAnnotations()); ok {
		return "", nil, fmt.Sprintf("%s %s in the service cluster is the copy of %s %s in workspace %s; spec.naming of PublishedResource %s "+
			"maps both objects onto one local name, and ferry does not overwrite another object's copy",
			pub.LocalKind, nsName(ns, name), pub.LocalKind, nsName(r.Namespace, r.Name), r.ClusterName, pub.Name)
	}
	adopt, why := mayAdoptUnmanaged(pub, got, remote)
	if adopt {
		a := &adoption{obj: got, from: adoptedFromUnmanaged,
			why: "it existed at the copy's place and was not created by ferry; spec.conflictPolicy of the PublishedResource is Adopt"}
		if _, ok := syncAgentRemote(got); ok {
			// api-syncagent's copy of this very object: its finalizer on
			// the kcp object is replaced too (the broker), or it would
			// block the object's deletion.
			a.from = adoptedFromAPISyncAgentPrefix + got.GetLabels()[saLabelAgent]
			a.why = "it was api-syncagent's copy of this object; spec.conflictPolicy of the PublishedResource is Adopt"
		}
		return got.GetUID(), a, ""
	}
	if why != "" {
		return "", nil, fmt.Sprintf("%s %s already exists in the service cluster and was not created by ferry; spec.conflictPolicy Adopt "+
			"does not take it over: %s", pub.LocalKind, nsName(ns, name), why)
	}
	return "", nil, fmt.Sprintf("%s %s already exists in the service cluster and was not created by ferry; ferry does not overwrite it "+
		"(rename or remove it there, change spec.naming of PublishedResource %s, or set its spec.conflictPolicy to Adopt to take it over)",
		pub.LocalKind, nsName(ns, name), pub.Name)
}
