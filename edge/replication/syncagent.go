package replication

import (
	"bytes"
	"context"
	"crypto/sha1" //nolint:gosec // api-syncagent's label and name hashes are SHA-1; not a security use
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strings"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/labels"

	ferryv1alpha1 "github.com/ferry-dev/ferry/api/v1alpha1"
	"github.com/ferry-dev/ferry/pkg/naming"
)

// api-syncagent's marks, as it writes them (kcp-dev/api-syncagent v0.x).
// On its copies in the service cluster: labels naming the kcp object's
// logical cluster and the SHA-1 (hex) of its namespace and name, its agent
// name, and annotations with the plain namespace and name (and workspace
// path). On kcp objects: its finalizer. Its last-known state of each kcp
// object is a Secret in its own namespace of the service cluster.
const (
	saLabelAgent         = "syncagent.kcp.io/agent-name"
	saLabelCluster       = "syncagent.kcp.io/remote-object-cluster"
	saLabelNamespaceHash = "syncagent.kcp.io/remote-object-namespace-hash"
	saLabelNameHash      = "syncagent.kcp.io/remote-object-name-hash"
	saAnnotationNS       = "syncagent.kcp.io/remote-object-namespace"
	saAnnotationName     = "syncagent.kcp.io/remote-object-name"
	// saLabelState marks its last-known-state Secrets (value "true").
	saLabelState = "syncagent.kcp.io/object-state"
	// saStatePrefix begins a state Secret's name:
	// obj-state-<logical cluster>-<first 20 hex of the SHA-1 of the JSON
	// {apiVersion, kind, name, namespace} of the kcp object>.
	saStatePrefix = "obj-state-"
)

// saHash is api-syncagent's hash of a string: the hex SHA-1.
func saHash(s string) string {
	sum := sha1.Sum([]byte(s)) //nolint:gosec // see import
	return hex.EncodeToString(sum[:])
}

// syncAgentRemote reads the kcp object an api-syncagent copy names; false
// when u carries no such marks or they disagree with each other (its hash
// labels are not those of its annotations: not trusted).
func syncAgentRemote(u *unstructured.Unstructured) (naming.Remote, bool) {
	l, ann := u.GetLabels(), u.GetAnnotations()
	r := naming.Remote{ClusterName: l[saLabelCluster], Namespace: ann[saAnnotationNS], Name: ann[saAnnotationName]}
	if r.ClusterName == "" || r.Name == "" || l[saLabelNameHash] != saHash(r.Name) {
		return r, false
	}
	if nsHash, ok := l[saLabelNamespaceHash]; ok != (r.Namespace != "") || ok && nsHash != saHash(r.Namespace) {
		return r, false
	}
	return r, true
}

// isSyncAgentCopyOf tells whether u is the copy api-syncagent agent made of
// remote: its agent label, and its marks name exactly remote's workspace,
// namespace and name. Its marks carry no kcp UID: a copy of an earlier kcp
// object of that name is the copy of the one that replaced it (as
// api-syncagent itself treats it).
func isSyncAgentCopyOf(u *unstructured.Unstructured, agent string, remote naming.Remote) bool {
	r, ok := syncAgentRemote(u)
	return ok && agent != "" && u.GetLabels()[saLabelAgent] == agent &&
		r.ClusterName == remote.ClusterName && r.Namespace == remote.Namespace && r.Name == remote.Name
}

// syncAgentSelector selects api-syncagent agent's copies of remote (by its
// labels; isSyncAgentCopyOf checks the rest).
func syncAgentSelector(agent string, remote naming.Remote) string {
	set := labels.Set{saLabelAgent: agent, saLabelCluster: remote.ClusterName, saLabelNameHash: saHash(remote.Name)}
	if remote.Namespace != "" {
		set[saLabelNamespaceHash] = saHash(remote.Namespace)
	}
	return labels.SelectorFromSet(set).String()
}

// findSyncAgentCopy returns api-syncagent's copy of remote when p adopts
// them (spec.adopt), wherever its naming rules put it; a refusal when
// there is more than one (which is remote's is not provable) or it is
// ferry's copy of another object.
func (e *Engine) findSyncAgentCopy(ctx context.Context, p *Published, remote naming.Remote) (*adoption, string, error) {
	if p.Adopt == nil || p.Adopt.From != ferryv1alpha1.AdoptFromAPISyncAgent || p.Adopt.AgentName == "" {
		return nil, "", nil
	}
	list, err := e.opts.Dynamic.Resource(p.Local).List(ctx, metav1.ListOptions{LabelSelector: syncAgentSelector(p.Adopt.AgentName, remote)})
	if err != nil {
		return nil, "", fmt.Errorf("cannot list api-syncagent's copies of %s: %w", p.LocalKind, err)
	}
	var found []*unstructured.Unstructured
	for i := range list.Items {
		if u := &list.Items[i]; isSyncAgentCopyOf(u, p.Adopt.AgentName, remote) {
			found = append(found, u)
		}
	}
	switch len(found) {
	case 0:
		return nil, "", nil
	case 1:
	default:
		places := make([]string, 0, len(found))
		for _, u := range found {
			places = append(places, nsName(u.GetNamespace(), u.GetName()))
		}
		return nil, fmt.Sprintf("api-syncagent (agent %s) left %d copies of this object in the service cluster (%s); ferry adopts one only when "+
			"it is the only one (remove the others there)", p.Adopt.AgentName, len(found), strings.Join(places, ", ")), nil
	}
	u := found[0]
	if r, ok := naming.RemoteFrom(u.GetLabels(), u.GetAnnotations()); ok && !isCopyOf(u, remote) {
		return nil, fmt.Sprintf("%s %s carries api-syncagent's marks of this object but is ferry's copy of %s in workspace %s; ferry does not "+
			"overwrite another object's copy", p.LocalKind, nsName(u.GetNamespace(), u.GetName()), nsName(r.Namespace, r.Name), r.ClusterName), nil
	}
	if u.GetDeletionTimestamp() != nil {
		return nil, "", fmt.Errorf("api-syncagent's copy %s %s is being deleted; waiting for it to go", p.LocalKind, nsName(u.GetNamespace(), u.GetName()))
	}
	return &adoption{obj: u, from: adoptedFromAPISyncAgentPrefix + p.Adopt.AgentName,
		why: fmt.Sprintf("it was api-syncagent's copy (agent %s); spec.adopt of the PublishedResource takes such copies over", p.Adopt.AgentName)}, "", nil
}

// syncAgentStateName is the name of api-syncagent's last-known-state
// Secret of the kcp object obj (its apiVersion and kind as kcp serves it)
// in logical cluster cluster.
func syncAgentStateName(cluster string, obj *unstructured.Unstructured) (string, error) {
	var buf bytes.Buffer
	// json.Encoder (sorted keys, HTML escaping, a trailing newline) is how
	// the name's hash input is written.
	if err := json.NewEncoder(&buf).Encode(map[string]any{
		"apiVersion": obj.GetAPIVersion(), "kind": obj.GetKind(), "namespace": obj.GetNamespace(), "name": obj.GetName(),
	}); err != nil {
		return "", err
	}
	sum := sha1.Sum(buf.Bytes()) //nolint:gosec // see import
	return saStatePrefix + cluster + "-" + hex.EncodeToString(sum[:])[:20], nil
}

// deleteSyncAgentState deletes api-syncagent's last-known-state Secret of
// the adopted kcp object kcpObj (of logical cluster cluster) in p's
// spec.adopt.stateNamespace, only when it provably is that object's: its
// name is the one api-syncagent gives that object's state, and its labels
// mark it as a state Secret of exactly that workspace, namespace and name.
// A missing Secret is fine. Deleted with its UID as a precondition.
func (e *Engine) deleteSyncAgentState(ctx context.Context, p *Published, cluster string, kcpObj *unstructured.Unstructured) error {
	if p.Adopt == nil || p.Adopt.StateNamespace == "" {
		return nil
	}
	name, err := syncAgentStateName(cluster, kcpObj)
	if err != nil {
		return fmt.Errorf("cannot compute the name of api-syncagent's state Secret: %w", err)
	}
	ns := p.Adopt.StateNamespace
	s, err := e.opts.Kube.CoreV1().Secrets(ns).Get(ctx, name, metav1.GetOptions{})
	switch {
	case apierrors.IsNotFound(err):
		return nil
	case err != nil:
		return fmt.Errorf("cannot read api-syncagent's state Secret %s/%s: %w", ns, name, err)
	}
	l := s.Labels
	nsHash, hasNS := l[saLabelNamespaceHash]
	if l[saLabelState] != "true" || l[saLabelCluster] != cluster || l[saLabelNameHash] != saHash(kcpObj.GetName()) ||
		hasNS != (kcpObj.GetNamespace() != "") || hasNS && nsHash != saHash(kcpObj.GetNamespace()) {
		e.opts.Log.Info("not deleting a Secret named like api-syncagent's state of an adopted object: its labels do not name that object",
			"secret", ns+"/"+name, "workspace", cluster, "remoteNamespace", kcpObj.GetNamespace(), "remoteName", kcpObj.GetName())
		return nil
	}
	uid := s.UID
	err = e.opts.Kube.CoreV1().Secrets(ns).Delete(ctx, name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}})
	if err != nil && !apierrors.IsNotFound(err) {
		return fmt.Errorf("cannot delete api-syncagent's state Secret %s/%s: %w", ns, name, err)
	}
	e.opts.Log.Info("deleted api-syncagent's last-known state of an adopted object", "secret", ns+"/"+name, "workspace", cluster,
		"remoteNamespace", kcpObj.GetNamespace(), "remoteName", kcpObj.GetName())
	return nil
}

// clearSyncAgentState deletes the state Secret of k's adopted copy
// (deleteSyncAgentState) unless this process saw it gone already.
func (e *Engine) clearSyncAgentState(ctx context.Context, p *Published, k ledgerKey, cluster string, kcpObj *unstructured.Unstructured) error {
	e.mu.Lock()
	_, done := e.stateCleared[k]
	e.mu.Unlock()
	if done {
		return nil
	}
	if err := e.deleteSyncAgentState(ctx, p, cluster, kcpObj); err != nil {
		return err
	}
	e.mu.Lock()
	e.stateCleared[k] = struct{}{}
	e.mu.Unlock()
	return nil
}
