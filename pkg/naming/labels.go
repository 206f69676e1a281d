package naming

import (
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation"
)

// Labels and annotations on local copies. Labels identify the kcp object
// (hashed where label values could be too long) so the edge finds local
// copies with a label selector; annotations keep the full values for people
// and for the inventory.
const (
	LabelAgent         = "ferry.dev/agent"
	LabelRemoteCluster = "ferry.dev/remote-cluster"
	LabelNamespaceHash = "ferry.dev/remote-namespace-hash"
	LabelNameHash      = "ferry.dev/remote-name-hash"
	// LabelRemoteResource is the kcp resource a copy belongs to
	// (ResourceLabelValue): the edge's watch, inventory and deletions of a
	// PublishedResource select on it, so a copy of another kcp resource on
	// the same local CRD is never listed, reported or deleted.
	LabelRemoteResource = "ferry.dev/remote-resource"
	// LabelPublishedResource is the PublishedResource that last applied the
	// copy (PublishedResourceLabelValue). Informational: copies are selected
	// by their kcp resource, so a PublishedResource recreated for the same
	// kcp resource picks up the copies an earlier one orphaned (and
	// relabels them as it applies them).
	LabelPublishedResource = "ferry.dev/published-resource"

	AnnotationNamespace     = "ferry.dev/remote-namespace"
	AnnotationName          = "ferry.dev/remote-name"
	AnnotationUID           = "ferry.dev/remote-uid"
	AnnotationWorkspacePath = "ferry.dev/remote-workspace-path"
	// AnnotationResourceVersion is the kcp resourceVersion last applied
	// (informational).
	AnnotationResourceVersion = "ferry.dev/remote-resource-version"
	// AnnotationContentHash is the broker's hash of the desired state last
	// applied; the inventory reports it, so an unchanged object is never
	// applied again.
	AnnotationContentHash = "ferry.dev/content-hash"
	// AnnotationShape identifies the PublishedResource settings the copy
	// was last applied under (replica.Published.Shape).
	AnnotationShape = "ferry.dev/shape"
	// AnnotationLastApplied is the content (every field outside metadata
	// and status) the edge last applied from kcp to a copy whose
	// PublishedResource keeps local edits (spec.localEdits Keep): the base
	// of the three-way merge that tells a local edit from a kcp change.
	AnnotationLastApplied = "ferry.dev/last-applied"

	// LabelRelatedTo, on a copy of a related object (on either side), is the
	// kcp UID of its primary object; LabelRelatedIdentifier is the related[]
	// entry. Together they are the only sync metadata on related copies in
	// kcp (besides an owner reference to the primary).
	LabelRelatedTo = "ferry.dev/related-to"
	// LabelWorkspace, on a namespace the edge created (it also carries
	// LabelAgent), is the logical cluster of the kcp workspace it was
	// created for; the edge writes a workspace's objects only into its own
	// namespaces (or namespaces the PublishedResource names statically).
	LabelWorkspace         = "ferry.dev/workspace"
	LabelRelatedIdentifier = "ferry.dev/related-identifier"
)

// Labels are the labels that identify remote's local copy for agent.
func Labels(agent string, remote Remote) map[string]string {
	return map[string]string{
		LabelAgent:         agent,
		LabelRemoteCluster: remote.ClusterName,
		LabelNamespaceHash: Hash(remote.Namespace),
		LabelNameHash:      Hash(remote.Name),
	}
}

// Annotations hold the full remote coordinates; the workspace path only when
// known (PublishedResources with enableWorkspacePaths).
func Annotations(remote Remote) map[string]string {
	a := map[string]string{
		AnnotationNamespace: remote.Namespace,
		AnnotationName:      remote.Name,
		AnnotationUID:       remote.UID,
	}
	if remote.WorkspacePath != "" {
		a[AnnotationWorkspacePath] = remote.WorkspacePath
	}
	return a
}

// RemoteFrom reads the remote coordinates back from a local copy's labels
// and annotations; ok is false when they are missing or do not match each
// other (tampered labels), in which case the caller must not trust them.
func RemoteFrom(labels, annotations map[string]string) (Remote, bool) {
	r := Remote{
		ClusterName:   labels[LabelRemoteCluster],
		Namespace:     annotations[AnnotationNamespace],
		Name:          annotations[AnnotationName],
		UID:           annotations[AnnotationUID],
		WorkspacePath: annotations[AnnotationWorkspacePath],
	}
	if r.ClusterName == "" || r.Name == "" {
		return r, false
	}
	if labels[LabelNamespaceHash] != Hash(r.Namespace) || labels[LabelNameHash] != Hash(r.Name) {
		return r, false
	}
	return r, true
}

// labelValue is s when it is a valid label value, else its hash.
func labelValue(s string) string {
	if len(validation.IsValidLabelValue(s)) == 0 {
		return s
	}
	return Hash(s)
}

// ResourceLabelValue is the value of LabelRemoteResource for the kcp
// resource gr: "<resource>.<group>" ("<resource>" for the core group), or
// its hash when that is no valid label value (over 63 characters).
func ResourceLabelValue(gr schema.GroupResource) string {
	return labelValue(gr.String())
}

// PublishedResourceLabelValue is the value of LabelPublishedResource for a
// PublishedResource: its name, or the name's hash when longer than a label
// value may be.
func PublishedResourceLabelValue(name string) string {
	return labelValue(name)
}

// OwnerLabels are the labels that tie a local copy to the kcp resource it
// belongs to and to the PublishedResource applying it.
func OwnerLabels(resource schema.GroupResource, publishedResource string) map[string]string {
	return map[string]string{
		LabelRemoteResource:    ResourceLabelValue(resource),
		LabelPublishedResource: PublishedResourceLabelValue(publishedResource),
	}
}

// CopySelector selects agent's copies of the kcp resource's objects.
func CopySelector(agent string, resource schema.GroupResource) string {
	return LabelAgent + "=" + agent + "," + LabelRemoteResource + "=" + ResourceLabelValue(resource)
}

// LegacyCopySelector selects agent's copies of kcp objects made by versions
// that did not record the kcp resource (no LabelRemoteResource): primary
// copies only (they carry LabelRemoteCluster; related copies do not).
func LegacyCopySelector(agent string) string {
	return LabelAgent + "=" + agent + "," + LabelRemoteCluster + ",!" + LabelRemoteResource + ",!" + LabelRelatedTo
}
