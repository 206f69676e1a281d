package e2e

import (
	"context"
	"fmt"
	"testing"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	ferryv1alpha1 "github.com/ferry-dev/ferry/api/v1alpha1"
	"github.com/ferry-dev/ferry/pkg/naming"
)

// TestRelatedProjection: a related kind is a CRD of the service cluster in
// a group of its own (quires.projrel.example.com), which another
// PublishedResource of this edge publishes schema-only (synchronization
// disabled) into the APIExport's group. The primary's related entries name
// it with a projection, as api-syncagent's documents do:
//   - origin service: the local GVR, projected into the export's group.
//     The Quire a controller makes in the service cluster appears in the
//     consumer's workspace under the projected GVR (of the kind kcp
//     serves there), and goes away with the primary.
//   - origin kcp: the GVR in kcp, projected back onto the local group. The
//     Quire the consumer makes in kcp is written to the service cluster
//     under the local GVR, and goes away with the primary.
//
// Before, admission refused any projection of a related kind.
func TestRelatedProjection(t *testing.T) {
	ctx := context.Background()
	own := sanitize(t.Name()) + ".e2e.ferry.dev" // the APIExport's name: its own group
	const localGroup = "projrel.example.com"
	disabled := false
	byReference := func(path string) *ferryv1alpha1.RelatedResourceObject {
		return &ferryv1alpha1.RelatedResourceObject{RelatedResourceObjectSpec: ferryv1alpha1.RelatedResourceObjectSpec{
			Reference: &ferryv1alpha1.RelatedResourceObjectReference{Path: path}}}
	}
	envs := newSyncEnvs(t, "c",
		// Listed first: the broker finds the related kind in kcp in the
		// APIExport, so it is published before the primary (a Publish that
		// comes first is retried until it is).
		publication{crd: testCRD(localGroup, "Quire", "quires", apiextensionsv1.NamespaceScoped, "v1"),
			spec: func(s *ferryv1alpha1.PublishedResourceSpec) {
				s.Synchronization = &ferryv1alpha1.SynchronizationSpec{Enabled: &disabled}
			}},
		publication{crd: testCRD("projfolio.example.com", "Folio", "folios", apiextensionsv1.NamespaceScoped, "v1"),
			spec: func(s *ferryv1alpha1.PublishedResourceSpec) {
				s.Related = []ferryv1alpha1.RelatedResourceSpec{{
					Identifier: "made", Origin: ferryv1alpha1.OriginService,
					Group: localGroup, Version: "v1", Resource: "quires",
					Projection: &ferryv1alpha1.RelatedResourceProjection{Group: own},
					Object:     byReference("spec.madeName"),
				}, {
					Identifier: "given", Origin: ferryv1alpha1.OriginKCP,
					Group: own, Version: "v1", Resource: "quires",
					Projection: &ferryv1alpha1.RelatedResourceProjection{Group: localGroup},
					Object:     byReference("spec.givenName"),
				}}
			}},
	)
	quires, folios := envs[0], envs[1]
	if quires.remoteGVR.Group != own {
		t.Fatalf("quires are served in kcp as %s, want group %s", quires.remoteGVR, own)
	}

	folio := folios.createRemote(t, "default", "atlas", map[string]any{"madeName": "atlas-made", "givenName": "atlas-given"})
	local := folios.waitLocal(t, "default", "atlas", func(*unstructured.Unstructured) (bool, string) { return true, "" })

	// Origin service: the service's controller makes a Quire locally.
	made := &unstructured.Unstructured{Object: map[string]any{"apiVersion": localGroup + "/v1", "kind": "Quire",
		"metadata": map[string]any{"name": "atlas-made", "namespace": local.GetNamespace()},
		"spec":     map[string]any{"pages": "made by the service"}}}
	if _, err := quires.local.Namespace(local.GetNamespace()).Create(ctx, made, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the made Quire in kcp under the projected GVR", func(ctx context.Context) (bool, string) {
		c, err := quires.remote.Namespace("default").Get(ctx, "atlas-made", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		pages, _, _ := unstructured.NestedString(c.Object, "spec", "pages")
		return pages == "made by the service" && c.GetLabels()[naming.LabelRelatedTo] == string(folio.GetUID()) && c.GetKind() == "Quire",
			fmt.Sprintf("kind %s, spec.pages %q, labels %v", c.GetKind(), pages, c.GetLabels())
	})

	// Origin kcp: the consumer makes a Quire in kcp.
	given := &unstructured.Unstructured{Object: map[string]any{"apiVersion": own + "/v1", "kind": "Quire",
		"metadata": map[string]any{"name": "atlas-given", "namespace": "default"},
		"spec":     map[string]any{"pages": "given by the consumer"}}}
	if _, err := quires.remote.Namespace("default").Create(ctx, given, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the given Quire in the service cluster under the local GVR", func(ctx context.Context) (bool, string) {
		c, err := quires.local.Namespace(local.GetNamespace()).Get(ctx, "atlas-given", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		pages, _, _ := unstructured.NestedString(c.Object, "spec", "pages")
		return pages == "given by the consumer" && c.GetLabels()[naming.LabelRelatedTo] == string(folio.GetUID()),
			fmt.Sprintf("spec.pages %q, labels %v", pages, c.GetLabels())
	})

	// The copies go with the primary.
	folios.deleteRemoteAndWaitGone(t, "default", "atlas")
	waitFor(t, "the made Quire's copy gone from kcp", func(ctx context.Context) (bool, string) {
		_, err := quires.remote.Namespace("default").Get(ctx, "atlas-made", metav1.GetOptions{})
		return apierrors.IsNotFound(err), fmt.Sprint(err)
	})
	waitFor(t, "the given Quire's copy gone from the service cluster", func(ctx context.Context) (bool, string) {
		_, err := quires.local.Namespace(local.GetNamespace()).Get(ctx, "atlas-given", metav1.GetOptions{})
		return apierrors.IsNotFound(err), fmt.Sprint(err)
	})
	// The originals stay: the service's Quire and the consumer's.
	if _, err := quires.local.Namespace(local.GetNamespace()).Get(ctx, "atlas-made", metav1.GetOptions{}); err != nil {
		t.Errorf("the service's own Quire: %v", err)
	}
	if _, err := quires.remote.Namespace("default").Get(ctx, "atlas-given", metav1.GetOptions{}); err != nil {
		t.Errorf("the consumer's own Quire: %v", err)
	}
}
