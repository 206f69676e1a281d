package replication

import (
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/ferry-dev/ferry/pkg/logging"
	"github.com/ferry-dev/ferry/pkg/naming"
)

// Identity on the copy. Every local copy carries, besides the labels that
// name its kcp object (workspace, namespace, name), the kcp resource it
// belongs to (naming.LabelRemoteResource) and the PublishedResource that
// last applied it (naming.LabelPublishedResource). A PublishedResource's
// watch, inventory, deletions and DeleteCopies select on its agent and its
// kcp resource, so copies of another kcp resource on the same local CRD
// (another PublishedResource's, or an earlier one's deleted with Orphan)
// are never listed, reported to the broker as this resource's, or deleted.
//
// Selection is by the kcp resource, not by the PublishedResource's name: a
// PublishedResource recreated for the same kcp resource picks up the
// copies an earlier one orphaned (README promises it). They are reported
// unapplied while their PublishedResource label names another one, so the
// broker re-sends them (through its window) and the apply relabels them.
//
// Copies made by earlier versions of ferry carry neither label, and
// nothing on them records their kcp resource. They are adopted only with
// proof: an upsert for exactly their kcp object — this PublishedResource's
// kcp resource, their workspace, namespace and name, and the kcp UID their
// annotations record (kcp UIDs are unique) — is applied where the copy is,
// which adds the labels. A second watch per PublishedResource sees this
// agent's unlabelled primary copies (naming.LegacyCopySelector) so the
// apply finds them in place. The broker sends that upsert for every kcp
// object whose copy the inventory does not list, so every legacy copy whose
// kcp object still exists is adopted, through the broker's window, after
// the first connection.
//
// Until then an unlabelled copy is never listed in an inventory, reported,
// or deleted: not by the broker's "gone" path, not by a delete intent, not
// by DeleteCopies. A copy whose kcp object is gone (or whose kcp resource
// no PublishedResource serves any more, as after one deleted with Orphan)
// stays, for a person to remove. Adopting by "only one PublishedResource of
// this edge publishes that local resource" was rejected: the copies an
// earlier PublishedResource of another kcp resource orphaned on the same
// CRD would be labelled as the new one's, listed in its inventory, and
// deleted by the broker as gone — the data loss this labelling fixes.

// resourceLabel is the value of naming.LabelRemoteResource on p's copies.
func (p *Published) resourceLabel() string {
	return naming.ResourceLabelValue(p.Remote.GroupResource())
}

// ownerLabels are the identity labels of p's copies.
func (p *Published) ownerLabels() map[string]string {
	return naming.OwnerLabels(p.Remote.GroupResource(), p.Name)
}

// labelledFor tells whether u carries p's identity labels (kcp resource
// and PublishedResource).
func labelledFor(u *unstructured.Unstructured, p *Published) bool {
	l := u.GetLabels()
	return l[naming.LabelRemoteResource] == p.resourceLabel() && l[naming.LabelPublishedResource] == naming.PublishedResourceLabelValue(p.Name)
}

// ofResource tells whether u, ferry's copy of an object by its other
// labels (isCopyOf), belongs to p's kcp resource: its resource label says
// so, or it has none (an earlier version made it) and its annotations carry
// uid, the kcp UID of the object an upsert is for (kcp UIDs are unique).
func ofResource(u *unstructured.Unstructured, p *Published, uid string) bool {
	if got, ok := u.GetLabels()[naming.LabelRemoteResource]; ok {
		return got == p.resourceLabel()
	}
	return uid != "" && u.GetAnnotations()[naming.AnnotationUID] == uid
}

// findLegacy returns the copy of remote an earlier version made, found by
// its labels in w's legacy cache, when its annotations record remote's kcp
// UID; nil otherwise.
func findLegacy(w *localWatch, remote naming.Remote) *unstructured.Unstructured {
	if remote.UID == "" {
		return nil
	}
	for _, u := range cachedCopies(w.legacy, remote) {
		if u.GetAnnotations()[naming.AnnotationUID] == remote.UID && u.GetLabels()[naming.LabelRemoteResource] == "" {
			return u
		}
	}
	return nil
}

// legacyLeft logs a delete of an object whose copy was made by an earlier
// version and not adopted yet: it is not deleted (nothing proves it is a
// copy of this kcp resource's object), and stays for a person to remove.
func (e *Engine) legacyLeft(w *localWatch, remote naming.Remote) {
	for _, u := range cachedCopies(w.legacy, remote) {
		e.opts.Log.Info("not deleting a local copy made by an earlier version of ferry, which does not record its kcp resource; remove it by hand if it is no longer wanted",
			logging.KeyPublishedResource, w.pub.Name, "local", nsName(u.GetNamespace(), u.GetName()), "workspace", remote.ClusterName,
			"remoteNamespace", remote.Namespace, "remoteName", remote.Name)
	}
}
