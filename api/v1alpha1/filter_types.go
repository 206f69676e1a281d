package v1alpha1

import (
	"bytes"
	"encoding/json"
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
)

// ResourceFilter selects which kcp objects are synced.
type ResourceFilter struct {
	// Namespace restricts namespaced objects to some kcp namespaces. It is
	// either a namespace name (a string: only objects in the namespace of
	// that name, in every workspace — the seeds' spelling) or a label
	// selector over the kcp namespaces (matchLabels / matchExpressions —
	// ferry's and api-syncagent's spelling). Unset: every namespace.
	// Cluster-scoped objects are not affected.
	// +optional
	// +kubebuilder:validation:Schemaless
	// +kubebuilder:validation:XPreserveUnknownFields
	Namespace *NamespaceFilter `json:"namespace,omitempty"`
	// Resource selects by the object's own labels.
	// +optional
	Resource *metav1.LabelSelector `json:"resource,omitempty"`
}

// NamespaceFilter is a namespace name or a label selector over namespaces;
// exactly one of Name and Selector is set. In JSON it is a string (the name)
// or an object (the selector), so documents of either spelling are read as
// written.
//
// The schema cannot say "string or object" structurally, so the field is
// kept as written (x-kubernetes-preserve-unknown-fields). The API server
// refuses CEL rules on such a typeless field and hides it from rules on the
// objects around it, so its type cannot be checked at admission: anything
// else (a number, a list, a bad name, an unknown key) is kept in Invalid and
// refused on the PublishedResource's condition (FilterInvalid) by Validate.
// Decoding never fails, so one bad document cannot break reading the others.
type NamespaceFilter struct {
	// Name is a namespace name.
	Name string `json:"-"`
	// Selector selects namespaces by their labels.
	Selector *metav1.LabelSelector `json:"-"`
	// Invalid holds a value that is neither (as written), for Validate.
	Invalid []byte `json:"-"`
}

// MarshalJSON writes the name as a string, the selector as an object and
// an invalid value as it was written.
func (f NamespaceFilter) MarshalJSON() ([]byte, error) {
	switch {
	case f.Invalid != nil:
		return f.Invalid, nil
	case f.Selector != nil:
		return json.Marshal(f.Selector)
	}
	return json.Marshal(f.Name)
}

// UnmarshalJSON reads a string as the name and an object as the selector;
// anything else is kept in Invalid (never an error, see the type).
func (f *NamespaceFilter) UnmarshalJSON(data []byte) error {
	data = bytes.TrimSpace(data)
	*f = NamespaceFilter{}
	switch {
	case len(data) > 0 && data[0] == '"':
		if json.Unmarshal(data, &f.Name) == nil && len(validation.IsDNS1123Label(f.Name)) == 0 {
			return nil
		}
	case len(data) > 0 && data[0] == '{':
		var keys map[string]json.RawMessage
		var sel metav1.LabelSelector
		if json.Unmarshal(data, &keys) == nil && json.Unmarshal(data, &sel) == nil && onlySelectorKeys(keys) {
			f.Selector = &sel
			return nil
		}
	case bytes.Equal(data, []byte("null")):
		return nil
	}
	*f = NamespaceFilter{Invalid: bytes.Clone(data)}
	return nil
}

func onlySelectorKeys(keys map[string]json.RawMessage) bool {
	for k := range keys {
		if k != "matchLabels" && k != "matchExpressions" {
			return false
		}
	}
	return true
}

// Validate says what is wrong with the filter and what to write instead.
func (f *NamespaceFilter) Validate() error {
	if f == nil || f.Invalid == nil {
		return nil
	}
	return fmt.Errorf("spec.filter.namespace is %s: write a kcp namespace name (a string such as my-app) or a label selector over kcp namespaces (an object with matchLabels and/or matchExpressions)", f.Invalid)
}

// NamespaceName returns the namespace name the filter names, if it is one.
func (f *NamespaceFilter) NamespaceName() (string, bool) {
	if f == nil || f.Selector != nil || f.Invalid != nil || f.Name == "" {
		return "", false
	}
	return f.Name, true
}

// LabelSelector returns the selector the filter holds, if it is one.
func (f *NamespaceFilter) LabelSelector() (*metav1.LabelSelector, bool) {
	if f == nil || f.Selector == nil {
		return nil, false
	}
	return f.Selector, true
}
