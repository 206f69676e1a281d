package related

import (
	"errors"
	"fmt"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"

	ferryv1alpha1 "github.com/ferry-dev/ferry/api/v1alpha1"
)

// watch.labelSelector (origin service): the edge's informers of the
// related kind list and watch only objects with these labels, so the
// service cluster's other objects of the kind — every Secret of a
// namespace — are never held in the edge's memory, and an object without
// the labels is not found. It is static (no templates): one informer
// serves every primary object.

// compileWatch compiles w, the entry's watch, for origin.
func compileWatch(w *ferryv1alpha1.RelatedResourceWatch, origin ferryv1alpha1.RelatedResourceOrigin) (labels.Selector, error) {
	if origin != ferryv1alpha1.OriginService {
		return nil, errors.New("watch: it narrows what the edge caches of a service-origin related kind; for origin kcp the broker watches the objects in kcp, so drop watch or set origin: service")
	}
	sel, err := metav1.LabelSelectorAsSelector(&w.LabelSelector)
	if err != nil {
		return nil, fmt.Errorf("watch.labelSelector: %w", err)
	}
	if sel.Empty() {
		return nil, errors.New("watch.labelSelector: it selects every object; name the labels the related objects carry, or drop watch to cache every object of the kind")
	}
	return sel, nil
}

// WatchSelector returns the entry's watch.labelSelector in the API
// server's syntax (e.g. "app=db,tier in (a,b)"), or "" when the entry has
// none: every object of the kind is cached and found.
func (r *Reference) WatchSelector() string {
	if r.watch == nil {
		return ""
	}
	return r.watch.String()
}

// Watches tells whether an object with objLabels can be found for the
// entry: it matches the entry's watch.labelSelector, or the entry has none.
// The edge checks it on every lookup, also when its informer of the kind
// caches more (another entry of the kind watches every object).
func (r *Reference) Watches(objLabels map[string]string) bool {
	return r.watch == nil || r.watch.Matches(labels.Set(objLabels))
}
