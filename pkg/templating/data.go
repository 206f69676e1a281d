package templating

import (
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
)

// Data is what every template sees. Which fields are set depends on where
// the template is used (docs/ancestors.md has the table); unset objects are
// empty, so a template reading them fails with a missing key.
//
// Names by origin:
//   - ferry: .Object, .Local, .Remote, .Value (mutations); .ClusterName,
//     .WorkspacePath, .Namespace, .Name (naming).
//   - the seeds: .LocalObject, .RemoteObject, with typed metadata views
//     (.LocalObject.ObjectMeta.Namespace, .RemoteObject.TypeMeta.Kind).
//   - api-syncagent: .Object, .ClusterName, .ClusterPath, .Side, .Value,
//     .RelatedObject, .LocalObject, .RemoteObject.
type Data struct {
	// Object is the object the template is about: in naming, the kcp
	// object; in a mutation, the object being mutated; in a related
	// template, the primary object on the side evaluated.
	Object Object
	// Local and Remote are the object in the service cluster and in kcp
	// (ferry's mutation names).
	Local, Remote Object
	// LocalObject and RemoteObject are the same objects under the seeds' and
	// api-syncagent's names.
	LocalObject, RemoteObject Object
	// RelatedObject is the related object found by a selector (related
	// rewrites).
	RelatedObject Object
	// Value is the current value at the mutated path, or the value a
	// related rewrite works on.
	Value any
	// ClusterName is the logical cluster name of the kcp workspace.
	ClusterName string
	// ClusterPath and WorkspacePath are the workspace path, when known.
	ClusterPath, WorkspacePath string
	// Namespace and Name are the kcp object's namespace and name (naming).
	Namespace, Name string
	// Side is "kcp" or "service": the side a related template is evaluated
	// for.
	Side string
}

// Object is a Kubernetes object as decoded JSON. Templates read it as a map
// (.Object.metadata.name) and, as the seeds write it, through typed views:
// .LocalObject.ObjectMeta.Namespace, .RemoteObject.TypeMeta.Kind.
type Object map[string]any

// ObjectMeta is the object's metadata as a typed view.
func (o Object) ObjectMeta() (metav1.ObjectMeta, error) {
	var meta metav1.ObjectMeta
	raw, ok := o["metadata"].(map[string]any)
	if !ok {
		return meta, nil
	}
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(raw, &meta); err != nil {
		return meta, fmt.Errorf("metadata: %w", err)
	}
	return meta, nil
}

// TypeMeta is the object's apiVersion and kind as a typed view.
func (o Object) TypeMeta() metav1.TypeMeta {
	apiVersion, _ := o["apiVersion"].(string)
	kind, _ := o["kind"].(string)
	return metav1.TypeMeta{APIVersion: apiVersion, Kind: kind}
}

// SampleObject is an object of the given kind for Check: metadata only
// (name, namespace when namespaced, uid, empty labels and annotations), so
// a template that reads anything else is not refused for the sample's
// sake.
func SampleObject(apiVersion, kind string, namespaced bool) Object {
	meta := map[string]any{
		"name": "sample", "uid": "00000000-0000-0000-0000-000000000000",
		"labels": map[string]any{}, "annotations": map[string]any{},
	}
	if namespaced {
		meta["namespace"] = "sample-namespace"
	}
	return Object{"apiVersion": apiVersion, "kind": kind, "metadata": meta}
}

// SampleData is Data for Check with every field set: an object of the kind
// on both sides and sample workspace names.
func SampleData(apiVersion, kind string, namespaced bool) Data {
	obj := SampleObject(apiVersion, kind, namespaced)
	ns := ""
	if namespaced {
		ns = "sample-namespace"
	}
	return Data{
		Object: obj, Local: obj, Remote: obj, LocalObject: obj, RemoteObject: obj, RelatedObject: obj,
		// No Value: the mutated path may hold a string or an object, and a
		// sample string would make ".Value.name" look wrong.
		Value: nil, ClusterName: "sample-cluster", ClusterPath: "root:sample", WorkspacePath: "root:sample",
		Namespace: ns, Name: "sample", Side: "kcp",
	}
}
