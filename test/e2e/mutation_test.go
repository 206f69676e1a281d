package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	ferryv1alpha1 "github.com/ferry-dev/ferry/api/v1alpha1"
)

func TestMutationsInBothDirections(t *testing.T) {
	ctx := context.Background()
	e := newSyncEnv(t, "mutate.example.com", "Vault", "vaults", func(s *ferryv1alpha1.PublishedResourceSpec) {
		s.Mutation = &ferryv1alpha1.ResourceMutationSpec{
			Spec: []ferryv1alpha1.ResourceMutation{
				{Regex: &ferryv1alpha1.RegexMutation{Path: "spec.secretName", Pattern: "^(.*)$", Replacement: "local-$1"}},
				{Delete: &ferryv1alpha1.DeleteMutation{Path: "spec.debug"}},
				{Template: &ferryv1alpha1.TemplateMutation{Path: "spec.origin", Template: "{{ .Remote.metadata.namespace }}/{{ .Remote.metadata.name }}"}},
				{CEL: &ferryv1alpha1.CELMutation{Path: "spec.size", Expression: "self * 2"}},
			},
			Status: []ferryv1alpha1.ResourceMutation{
				{Regex: &ferryv1alpha1.RegexMutation{Path: "status.secretName", Pattern: "^local-(.*)$", Replacement: "$1"}},
			},
		}
	})
	e.createRemote(t, "default", "v1", map[string]any{"secretName": "db", "debug": true, "size": int64(3)})
	local := e.waitLocal(t, "default", "v1", func(u *unstructured.Unstructured) (bool, string) {
		spec, _, _ := unstructured.NestedMap(u.Object, "spec")
		ok := spec["secretName"] == "local-db" && spec["debug"] == nil && spec["origin"] == "default/v1" && spec["size"] == int64(6)
		return ok, "spec " + toString(spec)
	})

	// The local name written into status does not leak into kcp.
	_ = unstructured.SetNestedField(local.Object, "local-db", "status", "secretName")
	if _, err := e.local.Namespace(local.GetNamespace()).UpdateStatus(ctx, local, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.waitRemote(t, "default", "v1", func(u *unstructured.Unstructured, err error) (bool, string) {
		if err != nil {
			return false, err.Error()
		}
		v, _, _ := unstructured.NestedString(u.Object, "status", "secretName")
		return v == "db", "status.secretName = " + v
	})
}

func TestInvalidMutationGetsCondition(t *testing.T) {
	p := newPubEnv(t)
	apply(t, testCRD("badmut.example.com", "Widget", "widgets", apiextensionsv1.NamespaceScoped, "v1"))
	// PublishedResources are cluster-scoped and the service cluster is shared
	// by all tests: the name must be unique.
	p.publish(t, "bad-mutations", ferryv1alpha1.PublishedResourceSpec{
		Resource: ferryv1alpha1.SourceResource{APIGroup: "badmut.example.com", Kind: "Widget", Version: "v1"},
		Mutation: &ferryv1alpha1.ResourceMutationSpec{Spec: []ferryv1alpha1.ResourceMutation{
			{CEL: &ferryv1alpha1.CELMutation{Path: "spec.x", Expression: `1 + "a"`}},
			{Regex: &ferryv1alpha1.RegexMutation{Path: "spec.y", Pattern: "(unclosed"}},
		}},
	})
	pr := p.waitCondition(t, "bad-mutations", metav1.ConditionFalse, ferryv1alpha1.ReasonMutationInvalid)
	msg := pr.Status.Conditions[0].Message
	for _, want := range []string{"spec.mutation.spec[0].cel.expression", "spec.mutation.spec[1].regex.pattern"} {
		if !strings.Contains(msg, want) {
			t.Errorf("condition message %q does not name %s", msg, want)
		}
	}
}

func toString(m map[string]any) string { return fmt.Sprint(m) }
