package e2e

import (
	"fmt"
	"strings"
	"testing"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	ferryv1alpha1 "github.com/ferry-dev/ferry/api/v1alpha1"
)

// TestAncestorTemplatesAndRegex: mutations and naming written as the seeds
// and api-syncagent document them work on real objects — a regex
// replacement "foo-\1", the seeds' {{ .LocalObject.ObjectMeta.Namespace }},
// api-syncagent's naming with .ClusterName and sha3short — and a template
// naming data that does not exist is refused on the PublishedResource
// (NamingInvalid) instead of failing on every object.
func TestAncestorTemplatesAndRegex(t *testing.T) {
	e := newSyncEnv(t, "anctmpl.example.com", "Scroll", "scrolls", func(s *ferryv1alpha1.PublishedResourceSpec) {
		s.Naming = &ferryv1alpha1.ResourceNaming{
			Namespace: "{{ .ClusterName }}",
			Name:      "{{ .Object.metadata.namespace | sha3short }}-{{ .Object.metadata.name | sha3short }}",
		}
		s.Mutation = &ferryv1alpha1.ResourceMutationSpec{Spec: []ferryv1alpha1.ResourceMutation{
			{Regex: &ferryv1alpha1.RegexMutation{Path: "spec.fieldV1", Pattern: "(.+)", Replacement: `foo-\1`}},
			{Template: &ferryv1alpha1.TemplateMutation{Path: "spec.owner", Template: "{{ .LocalObject.ObjectMeta.Namespace }}"}},
		}}
	})
	e.createRemote(t, "default", "s1", map[string]any{"fieldV1": "x"})
	local := e.waitLocal(t, "default", "s1", func(u *unstructured.Unstructured) (bool, string) {
		v, _ := specField(u, "fieldV1")
		owner, _ := specField(u, "owner")
		return v == "foo-x" && owner == u.GetNamespace(), fmt.Sprintf("spec.fieldV1 %q, spec.owner %q", v, owner)
	})
	if local.GetNamespace() != e.consumerLC || !strings.Contains(local.GetName(), "-") || len(local.GetName()) != 41 {
		t.Errorf("api-syncagent's naming gave %s/%s", local.GetNamespace(), local.GetName())
	}

	apply(t, testCRD("anctmplbad.example.com", "Quill", "quills", apiextensionsv1.NamespaceScoped, "v1"))
	e.publish(t, "quills", ferryv1alpha1.PublishedResourceSpec{
		Resource: ferryv1alpha1.SourceResource{APIGroup: "anctmplbad.example.com", Kind: "Quill", Version: "v1"},
		Naming:   &ferryv1alpha1.ResourceNaming{Name: "{{ .Objekt.metadata.name }}"},
	})
	pr := e.waitCondition(t, "quills", metav1.ConditionFalse, ferryv1alpha1.ReasonNamingInvalid)
	for _, c := range pr.Status.Conditions {
		if c.Type == ferryv1alpha1.ConditionPublished && !strings.Contains(c.Message, "can't evaluate field Objekt") {
			t.Errorf("NamingInvalid message %q does not name the missing data", c.Message)
		}
	}
}
