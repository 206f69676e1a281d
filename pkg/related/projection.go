package related

import (
	"errors"
	"fmt"
	"strings"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation"

	ferryv1alpha1 "github.com/ferry-dev/ferry/api/v1alpha1"
)

// Projection of a related kind (spec.related[].projection), with
// api-syncagent's semantics: the entry's group, version and resource are
// the related kind's on its origin side; each projection field set
// replaces its counterpart on the destination side. The broker and the
// edge both derive the pair here, so they agree on which resource each
// side reads and writes.

// Sides returns the related kind's resource on the entry's origin side and
// on its destination side (the same without a projection). An entry that
// names a kind instead of a resource gets the kind's conventional plural
// (the edge resolves the service cluster's exact one through discovery).
func Sides(s *ferryv1alpha1.RelatedResourceSpec) (origin, destination schema.GroupVersionResource) {
	version := s.Version
	if version == "" {
		version = "v1"
	}
	if s.Resource != "" {
		origin = schema.GroupVersionResource{Group: s.Group, Version: version, Resource: s.Resource}
	} else {
		origin, _ = meta.UnsafeGuessKindToResource(schema.GroupVersionKind{Group: s.Group, Version: version, Kind: s.Kind})
	}
	destination = origin
	if p := s.Projection; p != nil {
		// Unset (or empty) keeps the origin's: an empty group cannot mean
		// the core group, as in api-syncagent.
		if p.Group != "" {
			destination.Group = p.Group
		}
		if p.Version != "" {
			destination.Version = p.Version
		}
		if p.Resource != "" {
			destination.Resource = p.Resource
		}
	}
	return origin, destination
}

// KCPResource is the related kind's resource in kcp: the origin side's for
// origin kcp, the destination side's for origin service. The broker
// claims, watches and writes it.
func KCPResource(s *ferryv1alpha1.RelatedResourceSpec) schema.GroupVersionResource {
	origin, destination := Sides(s)
	if s.Origin.Normalized() == ferryv1alpha1.OriginKCP {
		return origin
	}
	return destination
}

// ServiceResource is the related kind's resource on the service cluster:
// the origin side's for origin service, the destination side's for origin
// kcp. The edge watches and writes it.
func ServiceResource(s *ferryv1alpha1.RelatedResourceSpec) schema.GroupVersionResource {
	origin, destination := Sides(s)
	if s.Origin.Normalized() == ferryv1alpha1.OriginKCP {
		return destination
	}
	return origin
}

// checkProjection refuses a projection that cannot work (admission refuses
// the same; this is for documents that bypassed it, e.g. through the
// broker).
func checkProjection(s *ferryv1alpha1.RelatedResourceSpec) error {
	p := s.Projection
	switch {
	case s.Resource == "":
		return errors.New("projection: name the origin side's resource (resource: the lowercase plural), not its kind: each side resolves its kind from its resource")
	case p.Group == "" && p.Version == "" && p.Resource == "":
		return errors.New("projection: set at least one of group, version and resource (the destination side's), or remove it")
	}
	if p.Resource != "" {
		if errs := validation.IsDNS1123Label(p.Resource); len(errs) > 0 {
			return fmt.Errorf("projection.resource %q: the lowercase plural, e.g. userdatabases: %s", p.Resource, strings.Join(errs, "; "))
		}
	}
	if p.Version != "" {
		if errs := validation.IsDNS1123Label(p.Version); len(errs) > 0 {
			return fmt.Errorf("projection.version %q: an API version, e.g. v1alpha1: %s", p.Version, strings.Join(errs, "; "))
		}
	}
	if p.Group != "" {
		if errs := validation.IsDNS1123Subdomain(p.Group); len(errs) > 0 {
			return fmt.Errorf("projection.group %q: an API group, e.g. api.example.com: %s", p.Group, strings.Join(errs, "; "))
		}
	}
	return nil
}
