package edgeload

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"strconv"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"

	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
	ferryv1alpha1 "github.com/ferry-dev/ferry/api/v1alpha1"
)

// The widget is the one small CRD a traffic edge publishes: namespaced,
// with a status subresource (so every applied object gets a status
// report), in an API group of the edge's own (its APIExport's name). Its
// spec carries when the generator wrote it, so the edge measures the intent
// round trip without sharing any state with the generator.
const (
	// WidgetPublishedResource is the PublishedResource's name at every
	// traffic edge.
	WidgetPublishedResource = "widgets"
	widgetPlural            = "widgets"
	widgetKind              = "Widget"
	widgetVersion           = "v1"
)

// WidgetPublish is the Publish a traffic edge sends for its widget CRD in
// group, built as ferry-edge builds one: the PublishedResource's spec and
// the CRD as JSON, a revision over both.
func WidgetPublish(group string) (*ferryv1.Publish, error) {
	spec, err := json.Marshal(ferryv1alpha1.PublishedResourceSpec{
		Resource: ferryv1alpha1.SourceResource{APIGroup: group, Kind: widgetKind, Version: widgetVersion},
	})
	if err != nil {
		return nil, err
	}
	crd, err := json.Marshal(widgetCRD(group))
	if err != nil {
		return nil, err
	}
	sum := sha256.New()
	sum.Write(spec)
	sum.Write(crd)
	return &ferryv1.Publish{
		PublishedResource:        WidgetPublishedResource,
		Generation:               1,
		Spec:                     spec,
		CustomResourceDefinition: crd,
		Revision:                 hex.EncodeToString(sum.Sum(nil))[:16],
	}, nil
}

func widgetCRD(group string) *apiextensionsv1.CustomResourceDefinition {
	obj := func(props map[string]apiextensionsv1.JSONSchemaProps) apiextensionsv1.JSONSchemaProps {
		return apiextensionsv1.JSONSchemaProps{Type: "object", Properties: props}
	}
	return &apiextensionsv1.CustomResourceDefinition{
		TypeMeta:   metav1.TypeMeta{APIVersion: "apiextensions.k8s.io/v1", Kind: "CustomResourceDefinition"},
		ObjectMeta: metav1.ObjectMeta{Name: widgetPlural + "." + group},
		Spec: apiextensionsv1.CustomResourceDefinitionSpec{
			Group: group,
			Names: apiextensionsv1.CustomResourceDefinitionNames{
				Plural: widgetPlural, Singular: "widget", Kind: widgetKind, ListKind: widgetKind + "List",
			},
			Scope: apiextensionsv1.NamespaceScoped,
			Versions: []apiextensionsv1.CustomResourceDefinitionVersion{{
				Name: widgetVersion, Served: true, Storage: true,
				Subresources: &apiextensionsv1.CustomResourceSubresources{Status: &apiextensionsv1.CustomResourceSubresourceStatus{}},
				Schema: &apiextensionsv1.CustomResourceValidation{OpenAPIV3Schema: &apiextensionsv1.JSONSchemaProps{
					Type: "object",
					Properties: map[string]apiextensionsv1.JSONSchemaProps{
						"spec": obj(map[string]apiextensionsv1.JSONSchemaProps{
							"revision":  {Type: "integer"},
							"writtenAt": {Type: "string"},
						}),
						"status": obj(map[string]apiextensionsv1.JSONSchemaProps{
							"observedRevision": {Type: "integer"},
							"phase":            {Type: "string"},
						}),
					},
				}},
			}},
		},
	}
}

// Widget is a widget object to create in kcp: resource is the served
// resource (from the PublishResult), kind its projected kind; revision
// and writtenAt go into its spec.
func Widget(resource schema.GroupVersionResource, kind, namespace, name string, revision int64, writtenAt time.Time) *unstructured.Unstructured {
	u := &unstructured.Unstructured{Object: map[string]any{"spec": widgetSpec(revision, writtenAt)}}
	u.SetAPIVersion(resource.GroupVersion().String())
	u.SetKind(kind)
	u.SetNamespace(namespace)
	u.SetName(name)
	return u
}

// WidgetPatch is the JSON merge patch that updates a widget's spec.
func WidgetPatch(revision int64, writtenAt time.Time) []byte {
	data, _ := json.Marshal(map[string]any{"spec": widgetSpec(revision, writtenAt)}) // maps of strings and numbers always encode
	return data
}

func widgetSpec(revision int64, writtenAt time.Time) map[string]any {
	// Nanoseconds as a string: exact, whatever decodes the JSON.
	return map[string]any{"revision": revision, "writtenAt": strconv.FormatInt(writtenAt.UnixNano(), 10)}
}

// widgetWritten reads revision and write time from a widget's JSON (an
// UpsertIntent's object); ok is false for anything else.
func widgetWritten(object []byte) (revision int64, at time.Time, ok bool) {
	var w struct {
		Spec struct {
			Revision  int64  `json:"revision"`
			WrittenAt string `json:"writtenAt"`
		} `json:"spec"`
	}
	if err := json.Unmarshal(object, &w); err != nil {
		return 0, time.Time{}, false
	}
	n, err := strconv.ParseInt(w.Spec.WrittenAt, 10, 64)
	if err != nil {
		return w.Spec.Revision, time.Time{}, false
	}
	return w.Spec.Revision, time.Unix(0, n), true
}

// widgetStatus is the status a traffic edge reports for an applied widget.
func widgetStatus(revision int64) []byte {
	return fmt.Appendf(nil, `{"observedRevision":%d,"phase":"Applied"}`, revision)
}
