package replication

import (
	"context"
	"fmt"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
	ferryv1alpha1 "github.com/ferry-dev/ferry/api/v1alpha1"
	"github.com/ferry-dev/ferry/pkg/logging"
	"github.com/ferry-dev/ferry/pkg/naming"
)

// Adoption: taking over, in place, a local object ferry did not create.
//
// Two ways lead here (ferryv1alpha1.ConflictPolicy, ferryv1alpha1.AdoptSpec):
//   - spec.conflictPolicy Adopt: an object nobody marked as a copy sits at
//     the place the naming rules give a kcp object's copy (claim);
//   - spec.adopt: api-syncagent's copy of exactly that kcp object, found by
//     its labels wherever it is (syncagent.go).
//
// Either way the object is written by the same server-side apply as any
// copy, carrying its UID as a precondition: it is never deleted or
// recreated, and an object replaced at that name since it was checked is
// not written. The adoption is recorded on the object (adoptedAt,
// adoptedFrom; carried on by every later apply, so they stay) and as an
// Adopted Event.

// Annotations recording an adoption on the local object.
const (
	// annotationAdoptedAt is when the edge adopted the object (RFC 3339).
	annotationAdoptedAt = "ferry.dev/adopted-at"
	// annotationAdoptedFrom is what the object was before:
	// adoptedFromUnmanaged, or adoptedFromAPISyncAgentPrefix + agent name.
	annotationAdoptedFrom = "ferry.dev/adopted-from"
)

// Values of annotationAdoptedFrom.
const (
	// adoptedFromUnmanaged: an object that was no sync agent's copy,
	// adopted by conflictPolicy Adopt.
	adoptedFromUnmanaged = "unmanaged"
	// adoptedFromAPISyncAgentPrefix, followed by api-syncagent's agent
	// name: its copy, adopted by spec.adopt.
	adoptedFromAPISyncAgentPrefix = "api-syncagent/"
)

// adoption is what an apply takes over: the local object and what it was.
type adoption struct {
	obj  *unstructured.Unstructured
	from string // annotationAdoptedFrom's value
	// why is the human account (Event, log).
	why string
}

// adoptionAnnotations are the annotations to apply on a copy: a new
// adoption's, or those an earlier one left on existing (an apply that
// left them out would remove them: the edge's field manager owns them).
func adoptionAnnotations(existing *unstructured.Unstructured, adopting *adoption, now time.Time) map[string]string {
	if adopting != nil {
		return map[string]string{annotationAdoptedAt: now.UTC().Format(time.RFC3339), annotationAdoptedFrom: adopting.from}
	}
	if existing == nil {
		return nil
	}
	ann := existing.GetAnnotations()
	if ann[annotationAdoptedFrom] == "" {
		return nil
	}
	return map[string]string{annotationAdoptedAt: ann[annotationAdoptedAt], annotationAdoptedFrom: ann[annotationAdoptedFrom]}
}

// adoptedFrom tells the broker whose copy a copy was (its
// annotationAdoptedFrom), so it replaces that agent's finalizer on the kcp
// object; said on every ack, so an answer lost with a stream is repeated.
func adoptedFrom(ann map[string]string) ferryv1.AdoptedFrom {
	if v := ann[annotationAdoptedFrom]; len(v) > len(adoptedFromAPISyncAgentPrefix) && v[:len(adoptedFromAPISyncAgentPrefix)] == adoptedFromAPISyncAgentPrefix {
		return ferryv1.AdoptedFrom_ADOPTED_FROM_API_SYNCAGENT
	}
	return ferryv1.AdoptedFrom_ADOPTED_FROM_UNSPECIFIED
}

// mayAdoptUnmanaged tells whether got, found at the place of remote's copy
// and not ferry's copy of anything, is taken over under p's conflict
// policy: Adopt, and no sync agent's copy of another kcp object (an
// api-syncagent copy names its kcp object; taking another object's copy
// would steal it).
func mayAdoptUnmanaged(p *Published, got *unstructured.Unstructured, remote naming.Remote) (bool, string) {
	if p.ConflictPolicy != ferryv1alpha1.ConflictPolicyAdopt {
		return false, ""
	}
	if r, ok := syncAgentRemote(got); ok && (r.ClusterName != remote.ClusterName || r.Namespace != remote.Namespace || r.Name != remote.Name) {
		return false, fmt.Sprintf("it is api-syncagent's copy of %s in workspace %s, not of this object", nsName(r.Namespace, r.Name), r.ClusterName)
	}
	if got.GetDeletionTimestamp() != nil {
		return false, "it is being deleted"
	}
	return true, ""
}

// recordAdoption writes the Adopted Event on the adopted object (after the
// apply succeeded). Best effort: the annotations are the record that
// stays; a lost Event is logged.
func (e *Engine) recordAdoption(ctx context.Context, p *Published, local *unstructured.Unstructured, a *adoption, remote naming.Remote) {
	e.opts.Log.Info("adopted a local object", logging.KeyPublishedResource, p.Name, "local", nsName(local.GetNamespace(), local.GetName()),
		"uid", string(local.GetUID()), "from", a.from, "workspace", remote.ClusterName, "remoteNamespace", remote.Namespace, "remoteName", remote.Name)
	ns := local.GetNamespace()
	if ns == "" {
		ns = metav1.NamespaceDefault // Events of cluster-scoped objects
	}
	now := metav1.NewTime(time.Now())
	ev := &corev1.Event{
		ObjectMeta: metav1.ObjectMeta{GenerateName: local.GetName() + ".", Namespace: ns},
		InvolvedObject: corev1.ObjectReference{APIVersion: local.GetAPIVersion(), Kind: local.GetKind(), Namespace: local.GetNamespace(),
			Name: local.GetName(), UID: local.GetUID(), ResourceVersion: local.GetResourceVersion()},
		Reason: "Adopted",
		Message: fmt.Sprintf("ferry-edge (PublishedResource %s) took this object over as the copy of %s in kcp workspace %s: %s",
			p.Name, nsName(remote.Namespace, remote.Name), remote.ClusterName, a.why),
		Type:                corev1.EventTypeNormal,
		Source:              corev1.EventSource{Component: FieldManager},
		FirstTimestamp:      now,
		LastTimestamp:       now,
		Count:               1,
		ReportingController: "ferry.dev/ferry-edge",
		ReportingInstance:   e.opts.Agent,
		Action:              "Adopt",
	}
	if _, err := e.opts.Kube.CoreV1().Events(ns).Create(ctx, ev, metav1.CreateOptions{}); err != nil {
		e.opts.Log.Error(err, "cannot record the Adopted Event (the object's ferry.dev/adopted-* annotations record the adoption)",
			"local", nsName(local.GetNamespace(), local.GetName()))
	}
}
