package replication

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/ferry-dev/ferry/pkg/fieldpath"
)

// Service-owned paths (spec.serviceOwnedPaths): fields ferry sets when it
// creates a copy and never applies again.
//
// Leaving a field out of the edge's apply is not enough: server-side apply
// removes a field its manager stops applying when nobody else owns it, so
// spec.replicas would vanish on the second apply. The field is handed over
// to a second field manager of ferry's, ServiceOwnedFieldManager, which
// applies the copy's own value of each path once (not forced: a value the
// cache holds stale conflicts with whoever changed it, and the apply is
// retried) and never again; the edge's manager then leaves the paths out.
// The hand-over records the paths it covers in AnnotationServiceOwned (owned
// by the same manager), so a copy is handed over again only when the set of
// paths changes — also for copies that existed before the paths were set:
// they keep their current values. Whoever writes the field next owns it.

// ServiceOwnedFieldManager is the field manager that holds service-owned
// paths after ferry created a copy.
const ServiceOwnedFieldManager = "ferry-edge-service-owned"

// AnnotationServiceOwned lists the service-owned paths handed over on a
// copy (comma-separated, sorted).
const AnnotationServiceOwned = "ferry.dev/service-owned-paths"

// CompileServiceOwned checks and parses spec.serviceOwnedPaths: dot-separated
// field paths of the object's content (not metadata, status, apiVersion or
// kind), none indexing into a list. The CRD's validation says the same at
// admission; this check covers API servers that do not enforce it.
func CompileServiceOwned(paths []string) ([]fieldpath.Path, error) {
	var out []fieldpath.Path
	for i, s := range paths {
		p, err := fieldpath.Parse(s)
		if err != nil {
			return nil, fmt.Errorf("spec.serviceOwnedPaths[%d]: %w; write a field path such as spec.replicas", i, err)
		}
		switch p[0] {
		case "metadata", "status", "apiVersion", "kind":
			return nil, fmt.Errorf("spec.serviceOwnedPaths[%d]: %s cannot be owned by the service cluster; name a field of the object's content, such as spec.replicas", i, p[0])
		}
		for _, seg := range p {
			if _, err := strconv.Atoi(seg); err == nil {
				return nil, fmt.Errorf("spec.serviceOwnedPaths[%d]: %q indexes into a list (a list is one value); name the whole list instead", i, s)
			}
		}
		out = append(out, p)
	}
	return out, nil
}

// serviceOwnedValue is the annotation value for paths.
func serviceOwnedValue(paths []fieldpath.Path) string {
	s := make([]string, 0, len(paths))
	for _, p := range paths {
		s = append(s, p.String())
	}
	slices.Sort(s)
	return strings.Join(slices.Compact(s), ",")
}

// parseServiceOwned reads the annotation value back.
func parseServiceOwned(v string) []fieldpath.Path {
	var out []fieldpath.Path
	for _, s := range strings.Split(v, ",") {
		if p, err := fieldpath.Parse(s); err == nil {
			out = append(out, p)
		}
	}
	return out
}

// stripPaths removes paths from obj (a desired copy or a recorded state).
func stripPaths(obj map[string]any, paths []fieldpath.Path) {
	for _, p := range paths {
		_ = p.Delete(obj) // absent already
	}
}

// handOver applies, as ServiceOwnedFieldManager, the values obj (a copy
// as the service cluster holds it) has at paths, with the annotation
// listing covered: that manager then owns exactly those fields. The UID
// precondition keeps it on this very copy.
func (e *Engine) handOver(ctx context.Context, pub *Published, obj *unstructured.Unstructured, paths []fieldpath.Path, covered string) error {
	cfg := &unstructured.Unstructured{Object: map[string]any{}}
	cfg.SetGroupVersionKind(pub.LocalGVK())
	cfg.SetNamespace(obj.GetNamespace())
	cfg.SetName(obj.GetName())
	cfg.SetUID(obj.GetUID())
	if covered != "" {
		cfg.SetAnnotations(map[string]string{AnnotationServiceOwned: covered})
	}
	for _, p := range paths {
		v, err := p.Get(obj.Object)
		if err != nil {
			continue // not set on the copy: nothing to keep
		}
		if err := p.Set(cfg.Object, v); err != nil {
			return fmt.Errorf("cannot hand %s over to the service cluster: %w", p, err)
		}
	}
	_, err := e.opts.Dynamic.Resource(pub.Local).Namespace(obj.GetNamespace()).Apply(ctx, obj.GetName(), cfg,
		metav1.ApplyOptions{FieldManager: ServiceOwnedFieldManager})
	if err != nil {
		return fmt.Errorf("cannot hand %s of %s %s over to the service cluster: %w", serviceOwnedValue(paths), pub.LocalKind, nsName(obj.GetNamespace(), obj.GetName()), err)
	}
	return nil
}

// serviceOwnedBefore prepares the apply of local over existing (nil for a
// new copy): an existing copy whose hand-over does not cover the current
// paths gets it first, with the paths it had too (none is let go before
// the edge's manager applies it again), and local leaves the paths out. A
// new copy is created with kcp's values (serviceOwnedAfter hands them over).
func (e *Engine) serviceOwnedBefore(ctx context.Context, pub *Published, existing, local *unstructured.Unstructured) error {
	if existing == nil {
		return nil
	}
	if handed := existing.GetAnnotations()[AnnotationServiceOwned]; handed != serviceOwnedValue(pub.ServiceOwned) {
		all := union(parseServiceOwned(handed), pub.ServiceOwned)
		if err := e.handOver(ctx, pub, existing, all, serviceOwnedValue(all)); err != nil {
			return err
		}
	}
	stripPaths(local.Object, pub.ServiceOwned)
	return nil
}

// serviceOwnedAfter finishes the apply of local that gave got: a new
// copy's paths are handed over, then the edge's manager lets go of them
// (should the edge stop in between, the next apply finds no hand-over and
// makes it first); on an existing copy, paths no longer service-owned,
// applied by the edge's manager again, are let go by the hand-over. It
// returns the copy as last written.
func (e *Engine) serviceOwnedAfter(ctx context.Context, pub *Published, existing, local, got *unstructured.Unstructured) (*unstructured.Unstructured, error) {
	want := serviceOwnedValue(pub.ServiceOwned)
	switch {
	case existing == nil && len(pub.ServiceOwned) > 0:
		if err := e.handOver(ctx, pub, got, pub.ServiceOwned, want); err != nil {
			return nil, err
		}
		stripPaths(local.Object, pub.ServiceOwned)
		local.SetUID(got.GetUID())
		out, err := e.opts.Dynamic.Resource(pub.Local).Namespace(got.GetNamespace()).Apply(ctx, got.GetName(), local,
			metav1.ApplyOptions{FieldManager: FieldManager, Force: true})
		if err != nil {
			return nil, fmt.Errorf("the service cluster refused %s %s: %w", pub.LocalKind, nsName(got.GetNamespace(), got.GetName()), err)
		}
		return out, nil
	case existing != nil:
		handed := existing.GetAnnotations()[AnnotationServiceOwned]
		if handed != want && serviceOwnedValue(union(parseServiceOwned(handed), pub.ServiceOwned)) != want {
			if err := e.handOver(ctx, pub, got, pub.ServiceOwned, want); err != nil {
				return nil, err
			}
		}
	}
	return got, nil
}

// union is a ∪ b, by path.
func union(a, b []fieldpath.Path) []fieldpath.Path {
	out := slices.Clone(a)
	for _, p := range b {
		if !slices.ContainsFunc(out, func(q fieldpath.Path) bool { return q.String() == p.String() }) {
			out = append(out, p)
		}
	}
	return out
}
