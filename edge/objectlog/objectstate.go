package objectlog

import (
	"errors"
	"fmt"
	"strings"

	"google.golang.org/protobuf/types/known/timestamppb"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"

	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
	"github.com/ferry-dev/ferry/pkg/naming"
	"github.com/ferry-dev/ferry/pkg/protocol"
)

// Resource is one PublishedResource of the engine.
type Resource struct {
	// Name of the PublishedResource.
	Name string
	// Remote is the resource as served in kcp; Local the local CRD's.
	Remote, Local schema.GroupVersionResource
}

// Source is the sync engine's state an object view reads. Implemented by
// *edge/replication.Engine.
type Source interface {
	// Agent is the edge's name, which its copies' labels carry.
	Agent() string
	// MatchPublished returns the PublishedResources whose name, kcp
	// resource or local resource is resource (in group, when set); all
	// when resource is empty. Ordered by name.
	MatchPublished(group, resource string) []Resource
	// CopyOf returns pr's local copy of the kcp object namespace/name in
	// workspace (its logical cluster, or the workspace path a copy with
	// workspace paths records); nil when there is none.
	CopyOf(pr, workspace, namespace, name string) *unstructured.Unstructured
	// LocalObject returns pr's local copy stored as key (namespace/name, or
	// name); nil when there is none.
	LocalObject(pr, key string) *unstructured.Unstructured
}

// ErrObjectNotFound is returned by ObjectState when the edge knows nothing
// of the object.
var ErrObjectNotFound = errors.New("not found")

// ErrInvalidQuery is returned by ObjectState for a query that selects
// nothing.
var ErrInvalidQuery = errors.New("invalid query")

// ObjectState explains one object, selected by its kcp key (workspace,
// resource, namespace, name) or by its local copy (local_name, optionally
// local_namespace and resource), from src's copies and the log.
func (l *Log) ObjectState(src Source, q *ferryv1.EdgeAdminServiceGetObjectStateRequest) (*ferryv1.EdgeAdminServiceGetObjectStateResponse, error) {
	group, resource := protocol.SplitResource(q.GetGroup(), q.GetResource())
	switch {
	case q.GetLocalName() != "":
		return l.byLocal(src, group, resource, q.GetLocalNamespace(), q.GetLocalName())
	case q.GetWorkspace() == "" || resource == "" || q.GetName() == "":
		return nil, fmt.Errorf("%w: select the object by workspace, resource, namespace and name (its kcp key), or by local_name and local_namespace (its local copy)", ErrInvalidQuery)
	}
	pubs := src.MatchPublished(group, resource)
	if len(pubs) == 0 {
		return nil, fmt.Errorf("%w: no PublishedResource of this edge publishes %q", ErrObjectNotFound, q.GetResource())
	}
	for _, pub := range pubs {
		if out, ok := l.byRemote(src, pub, q.GetWorkspace(), q.GetNamespace(), q.GetName()); ok {
			return out, nil
		}
	}
	return nil, fmt.Errorf("%w: the edge holds no copy of %s %s in workspace %s and handled no intent for it since it started",
		ErrObjectNotFound, q.GetResource(), nsName(q.GetNamespace(), q.GetName()), q.GetWorkspace())
}

// byRemote finds pub's object by its kcp key; workspace is the logical
// cluster or the workspace path the copy (or the last intent) carries.
func (l *Log) byRemote(src Source, pub Resource, workspace, namespace, name string) (*ferryv1.EdgeAdminServiceGetObjectStateResponse, bool) {
	if local := src.CopyOf(pub.Name, workspace, namespace, name); local != nil {
		return l.describe(pub, local, nil), true
	}
	if h, ok := l.last(objectID{workspace, pub.Remote.Group, pub.Remote.Resource, namespace, name}); ok {
		return l.describe(pub, nil, &h), true
	}
	if h, ok := l.lastByPath(workspace, pub.Remote.Group, pub.Remote.Resource, namespace, name); ok {
		return l.describe(pub, nil, &h), true
	}
	return nil, false
}

// byLocal finds an object by its local copy.
func (l *Log) byLocal(src Source, group, resource, namespace, name string) (*ferryv1.EdgeAdminServiceGetObjectStateResponse, error) {
	pubs := src.MatchPublished(group, resource)
	if len(pubs) == 0 {
		return nil, fmt.Errorf("%w: no PublishedResource of this edge publishes %q", ErrObjectNotFound, resource)
	}
	key := name
	if namespace != "" {
		key = namespace + "/" + name
	}
	for _, pub := range pubs {
		if u := src.LocalObject(pub.Name, key); u != nil {
			return l.describe(pub, u, nil), nil
		}
	}
	return nil, fmt.Errorf("%w: no local copy %s of this agent (the edge only knows copies labelled %s=%s)", ErrObjectNotFound, key, naming.LabelAgent, src.Agent())
}

// describe builds the answer from the local copy (nil when there is none)
// and the last intent handled (looked up when nil).
func (l *Log) describe(pub Resource, local *unstructured.Unstructured, h *handledIntent) *ferryv1.EdgeAdminServiceGetObjectStateResponse {
	out := &ferryv1.EdgeAdminServiceGetObjectStateResponse{PublishedResource: pub.Name}
	if local != nil {
		remote, _ := naming.RemoteFrom(local.GetLabels(), local.GetAnnotations())
		out.Key = &ferryv1.ObjectKey{
			Cluster:   remote.ClusterName,
			Resource:  &ferryv1.GroupVersionResource{Group: pub.Remote.Group, Version: pub.Remote.Version, Resource: pub.Remote.Resource},
			Namespace: remote.Namespace,
			Name:      remote.Name,
			Uid:       remote.UID,
		}
		out.WorkspacePath = remote.WorkspacePath
		out.LocalCopy = &ferryv1.LocalCopy{Namespace: local.GetNamespace(), Name: local.GetName()}
		out.LocalUid = string(local.GetUID())
		out.LocalResourceVersion = local.GetResourceVersion()
		ann := local.GetAnnotations()
		out.Applied = &ferryv1.AppliedState{
			ContentHash: ann[naming.AnnotationContentHash], ResourceVersion: ann[naming.AnnotationResourceVersion], Source: "local copy",
		}
		if h == nil {
			if got, ok := l.last(keyID(out.Key)); ok {
				h = &got
			}
		}
	}
	if h != nil {
		if out.Key == nil {
			out.Key = h.key
			out.WorkspacePath = h.workspacePath
		}
		out.LastIntent = &ferryv1.HandledIntent{
			Operation: "upsert", Version: h.version, ContentHash: h.hash, HandledAt: timestamppb.New(h.at),
		}
		if !h.upsert {
			out.LastIntent.Operation = "delete"
		}
		if ae := h.err; ae != nil {
			out.LastError = &ferryv1.ObjectError{Source: "intent", Error: ae, At: timestamppb.New(h.at)}
		}
		if a := out.GetApplied(); a != nil && h.upsert && h.err == nil {
			a.Current = a.GetContentHash() == h.hash
		}
	}
	out.Summary = edgeSummary(out)
	return out
}

func edgeSummary(s *ferryv1.EdgeAdminServiceGetObjectStateResponse) string {
	var parts []string
	if lc := s.GetLocalCopy(); lc != nil {
		parts = append(parts, "local copy "+nsName(lc.GetNamespace(), lc.GetName())+" applied from kcp resourceVersion "+s.GetApplied().GetResourceVersion())
	} else {
		parts = append(parts, "no local copy")
	}
	if e := s.GetLastError(); e != nil {
		retry := "final until the object or its PublishedResource changes"
		if e.GetError().GetRetryable() {
			retry = "the broker retries with backoff"
		}
		parts = append(parts, fmt.Sprintf("the last intent failed: %s: %s (%s)",
			protocol.ReasonName(e.GetError().GetReason()), e.GetError().GetMessage(), retry))
	}
	return strings.Join(parts, "; ")
}

func nsName(ns, name string) string {
	if ns == "" {
		return name
	}
	return ns + "/" + name
}
