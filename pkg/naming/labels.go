package naming

// Labels and annotations on local copies. Labels identify the kcp object
// (hashed where label values could be too long) so the edge finds local
// copies with a label selector; annotations keep the full values for people
// and for the inventory.
const (
	LabelAgent         = "ferry.dev/agent"
	LabelRemoteCluster = "ferry.dev/remote-cluster"
	LabelNamespaceHash = "ferry.dev/remote-namespace-hash"
	LabelNameHash      = "ferry.dev/remote-name-hash"

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
