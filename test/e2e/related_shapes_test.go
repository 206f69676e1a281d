package e2e

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	ferryv1alpha1 "github.com/ferry-dev/ferry/api/v1alpha1"
)

// TestRelatedAPISyncagentSpelling: related entries written the way
// api-syncagent documents them (resource + group/version, object.template
// and object.reference) sync both ways on real servers; a template tells
// the sides apart with .Side.
func TestRelatedAPISyncagentSpelling(t *testing.T) {
	ctx := context.Background()
	e := newSyncEnv(t, "spelling.example.com", "Casket", "caskets", func(s *ferryv1alpha1.PublishedResourceSpec) {
		s.Related = []ferryv1alpha1.RelatedResourceSpec{
			{
				Identifier: "tls", Origin: ferryv1alpha1.OriginService, Group: "", Version: "v1", Resource: "secrets",
				Object: &ferryv1alpha1.RelatedResourceObject{RelatedResourceObjectSpec: ferryv1alpha1.RelatedResourceObjectSpec{
					Template: &ferryv1alpha1.TemplateExpression{Template: `{{ .Object.spec.secretName }}{{ if eq .Side "kcp" }}-copy{{ end }}`},
				}},
			},
			{
				Identifier: "settings", Origin: ferryv1alpha1.OriginKCP, Version: "v1", Resource: "configmaps",
				Object: &ferryv1alpha1.RelatedResourceObject{
					RelatedResourceObjectSpec: ferryv1alpha1.RelatedResourceObjectSpec{
						Reference: &ferryv1alpha1.RelatedResourceObjectReference{Path: "spec.configName"},
					},
					Namespace: &ferryv1alpha1.RelatedResourceObjectSpec{
						Reference: &ferryv1alpha1.RelatedResourceObjectReference{Path: "metadata.namespace"},
					},
				},
			},
		}
	})
	svc := serviceKube(t)
	runSecretController(t, e.local, svc)
	consumer := e.consumerKube(t)
	if _, err := consumer.CoreV1().ConfigMaps("default").Create(ctx, &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: "settings"}, Data: map[string]string{"size": "large"},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.createRemote(t, "default", "web", map[string]any{"secretName": "web-tls", "configName": "settings"})
	local := e.waitLocal(t, "default", "web", func(*unstructured.Unstructured) (bool, string) { return true, "" })

	// Service origin: the local Secret web-tls is copied into kcp under the
	// name the template gives on the kcp side.
	waitSecretData(t, consumer, "default", "web-tls-copy", "tls.crt", "cert for "+local.GetName())
	// kcp origin: the consumer's ConfigMap is copied next to the local copy.
	waitFor(t, "the ConfigMap in the service cluster", func(ctx context.Context) (bool, string) {
		cm, err := svc.CoreV1().ConfigMaps(local.GetNamespace()).Get(ctx, "settings", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		return cm.Data["size"] == "large", fmt.Sprintf("data %v", cm.Data)
	})
}

// TestRelatedLabelSelectedSecrets: a label-selected related entry
// (origin service) syncs every Secret of the primary's local namespace
// that carries the primary's label — three per primary — into kcp under
// rewritten names; a fourth labelled later appears by itself (the edge
// watches the Secrets, nothing polls), and one unlabelled goes.
func TestRelatedLabelSelectedSecrets(t *testing.T) {
	ctx := context.Background()
	e := newSyncEnv(t, "selector.example.com", "Keyring", "keyrings", func(s *ferryv1alpha1.PublishedResourceSpec) {
		s.Related = []ferryv1alpha1.RelatedResourceSpec{{
			Identifier: "keys", Origin: ferryv1alpha1.OriginService, Version: "v1", Resource: "secrets",
			Object: &ferryv1alpha1.RelatedResourceObject{RelatedResourceObjectSpec: ferryv1alpha1.RelatedResourceObjectSpec{
				Selector: &ferryv1alpha1.RelatedResourceObjectSelector{
					LabelSelector: metav1.LabelSelector{MatchLabels: map[string]string{"keyring": "{{ .LocalObject.metadata.name }}"}},
					// The local names carry the local (hashed) primary name;
					// kcp sees only the key's own part.
					Rewrite: ferryv1alpha1.RelatedResourceSelectorRewrite{Regex: &ferryv1alpha1.RegexReplacement{Pattern: "^.*-(key[0-9]+)$", Replacement: "ring-$1"}},
				},
			}},
		}}
	})
	svc := serviceKube(t)
	consumer := e.consumerKube(t)
	e.createRemote(t, "default", "ring", map[string]any{"size": "3"})
	local := e.waitLocal(t, "default", "ring", func(*unstructured.Unstructured) (bool, string) { return true, "" })
	mkSecret := func(n int, labelled bool) {
		t.Helper()
		s := &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: fmt.Sprintf("%s-key%d", local.GetName(), n), Namespace: local.GetNamespace()},
			Data:       map[string][]byte{"key": []byte(fmt.Sprintf("secret %d", n))},
		}
		if labelled {
			s.Labels = map[string]string{"keyring": local.GetName()}
		}
		if _, err := svc.CoreV1().Secrets(local.GetNamespace()).Create(ctx, s, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	for n := 1; n <= 3; n++ {
		mkSecret(n, true)
	}
	mkSecret(4, false)
	copies := func(want ...string) {
		t.Helper()
		waitFor(t, fmt.Sprintf("copies %v in kcp", want), func(ctx context.Context) (bool, string) {
			list, err := consumer.CoreV1().Secrets("default").List(ctx, metav1.ListOptions{LabelSelector: "ferry.dev/related-identifier=keys"})
			if err != nil {
				return false, err.Error()
			}
			var got []string
			for _, s := range list.Items {
				got = append(got, s.Name)
				if want := fmt.Sprintf("secret %s", strings.TrimPrefix(s.Name, "ring-key")); string(s.Data["key"]) != want {
					return false, fmt.Sprintf("%s holds %q, want %q", s.Name, s.Data["key"], want)
				}
			}
			slices.Sort(got)
			return slices.Equal(got, want), fmt.Sprintf("copies %v", got)
		})
	}
	copies("ring-key1", "ring-key2", "ring-key3")

	// The fourth is labelled later: it appears by itself.
	four, err := svc.CoreV1().Secrets(local.GetNamespace()).Get(ctx, local.GetName()+"-key4", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	four.Labels = map[string]string{"keyring": local.GetName()}
	if _, err := svc.CoreV1().Secrets(four.Namespace).Update(ctx, four, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	copies("ring-key1", "ring-key2", "ring-key3", "ring-key4")

	// One unlabelled leaves kcp.
	one, err := svc.CoreV1().Secrets(local.GetNamespace()).Get(ctx, local.GetName()+"-key1", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	one.Labels = nil
	if _, err := svc.CoreV1().Secrets(one.Namespace).Update(ctx, one, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	copies("ring-key2", "ring-key3", "ring-key4")

	// Deleting the primary deletes every copy.
	if err := e.remote.Namespace("default").Delete(ctx, "ring", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	copies()
}

// TestRelatedCleanupFalseKeepsCopies: with cleanup: false the related
// copies outlive their primary on both sides — the service-origin Secret in
// kcp and the kcp-origin ConfigMap in the service cluster — released from
// ferry (no ferry.dev/ label, no owner reference kcp's garbage collector
// would follow).
func TestRelatedCleanupFalseKeepsCopies(t *testing.T) {
	ctx := context.Background()
	keep := false
	e := newSyncEnv(t, "cleanup.example.com", "Hoarder", "hoarders", func(s *ferryv1alpha1.PublishedResourceSpec) {
		s.Related = []ferryv1alpha1.RelatedResourceSpec{
			{
				Identifier: "tls", Origin: ferryv1alpha1.OriginService, Kind: "Secret", Cleanup: &keep,
				Reference: &ferryv1alpha1.RelatedResourceReference{Name: ferryv1alpha1.ResourceLocator{Path: "spec.secretName"}},
			},
			{
				Identifier: "settings", Origin: ferryv1alpha1.OriginKCP, Kind: "ConfigMap", Cleanup: &keep,
				Reference: &ferryv1alpha1.RelatedResourceReference{Name: ferryv1alpha1.ResourceLocator{Path: "spec.configName"}},
			},
		}
	})
	svc := serviceKube(t)
	runSecretController(t, e.local, svc)
	consumer := e.consumerKube(t)
	if _, err := consumer.CoreV1().ConfigMaps("default").Create(ctx, &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: "settings"}, Data: map[string]string{"size": "large"},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.createRemote(t, "default", "keeper", map[string]any{"secretName": "keeper-tls", "configName": "settings"})
	local := e.waitLocal(t, "default", "keeper", func(*unstructured.Unstructured) (bool, string) { return true, "" })
	waitSecretData(t, consumer, "default", "keeper-tls", "tls.crt", "cert for "+local.GetName())
	waitFor(t, "the ConfigMap in the service cluster", func(ctx context.Context) (bool, string) {
		_, err := svc.CoreV1().ConfigMaps(local.GetNamespace()).Get(ctx, "settings", metav1.GetOptions{})
		return err == nil, fmt.Sprint(err)
	})

	if err := e.remote.Namespace("default").Delete(ctx, "keeper", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	e.waitRemote(t, "default", "keeper", func(_ *unstructured.Unstructured, err error) (bool, string) {
		return apierrors.IsNotFound(err), fmt.Sprint(err)
	})
	ferrys := func(m map[string]string) []string {
		var out []string
		for k := range m {
			if strings.HasPrefix(k, "ferry.dev/") {
				out = append(out, k)
			}
		}
		return out
	}
	// Kept, released, and still there a while later (kcp's garbage
	// collector has nothing to follow).
	time.Sleep(3 * time.Second)
	s, err := consumer.CoreV1().Secrets("default").Get(ctx, "keeper-tls", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the Secret's copy in kcp went with its primary: %v", err)
	}
	if l := ferrys(s.Labels); len(l) > 0 || len(s.OwnerReferences) > 0 {
		t.Errorf("the kept copy in kcp is not released: labels %v, owners %v", l, s.OwnerReferences)
	}
	waitFor(t, "the local primary copy deleted", func(ctx context.Context) (bool, string) {
		_, err := e.local.Namespace(local.GetNamespace()).Get(ctx, local.GetName(), metav1.GetOptions{})
		return apierrors.IsNotFound(err), fmt.Sprint(err)
	})
	cm, err := svc.CoreV1().ConfigMaps(local.GetNamespace()).Get(ctx, "settings", metav1.GetOptions{})
	if err != nil {
		t.Fatalf("the ConfigMap's copy in the service cluster went with its primary: %v", err)
	}
	if l, a := ferrys(cm.Labels), ferrys(cm.Annotations); len(l)+len(a) > 0 {
		t.Errorf("the kept copy in the service cluster is not released: labels %v, annotations %v", l, a)
	}
}

// TestRelatedSyncStatus: a related kind with a status subresource — a CRD
// of this edge, published schema-only (synchronization disabled) in the
// same APIExport, so kcp serves it under the same group, version and
// resource — is related with syncStatus: the status the service cluster
// gives it is carried to its copy in kcp, and a change of it follows.
func TestRelatedSyncStatus(t *testing.T) {
	ctx := context.Background()
	own := sanitize(t.Name()) + ".e2e.ferry.dev" // the APIExport's name: its own group
	disabled := false
	envs := newSyncEnvs(t, "c",
		publication{crd: testCRD("syncstatus.example.com", "Abacus", "abacuses", apiextensionsv1.NamespaceScoped, "v1"),
			spec: func(s *ferryv1alpha1.PublishedResourceSpec) {
				s.Related = []ferryv1alpha1.RelatedResourceSpec{{
					Identifier: "grant", Origin: ferryv1alpha1.OriginService, Group: own, Version: "v1", Resource: "vouchers", SyncStatus: true,
					Object: &ferryv1alpha1.RelatedResourceObject{RelatedResourceObjectSpec: ferryv1alpha1.RelatedResourceObjectSpec{
						Reference: &ferryv1alpha1.RelatedResourceObjectReference{Path: "spec.grantName"},
					}},
				}}
			}},
		// Published after the PublishedResource that relates it: the edge
		// checks the related entry again when the CRD appears.
		publication{crd: testCRD(own, "Voucher", "vouchers", apiextensionsv1.NamespaceScoped, "v1"),
			spec: func(s *ferryv1alpha1.PublishedResourceSpec) {
				s.Synchronization = &ferryv1alpha1.SynchronizationSpec{Enabled: &disabled}
			}},
	)
	db, grants := envs[0], envs[1]
	db.createRemote(t, "default", "orders", map[string]any{"grantName": "orders-grant"})
	local := db.waitLocal(t, "default", "orders", func(*unstructured.Unstructured) (bool, string) { return true, "" })

	// The service's controller grants access and reports it in status.
	g := &unstructured.Unstructured{Object: map[string]any{"apiVersion": own + "/v1", "kind": "Voucher",
		"metadata": map[string]any{"name": "orders-grant", "namespace": local.GetNamespace()},
		"spec":     map[string]any{"user": "orders"}}}
	created, err := grants.local.Namespace(local.GetNamespace()).Create(ctx, g, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	setStatus := func(phase string) {
		t.Helper()
		created.Object["status"] = map[string]any{"phase": phase}
		if created, err = grants.local.Namespace(local.GetNamespace()).UpdateStatus(ctx, created, metav1.UpdateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	waitCopy := func(phase string) {
		t.Helper()
		waitFor(t, "the Grant's copy in kcp with status "+phase, func(ctx context.Context) (bool, string) {
			c, err := grants.remote.Namespace("default").Get(ctx, "orders-grant", metav1.GetOptions{})
			if err != nil {
				return false, err.Error()
			}
			got, _, _ := unstructured.NestedString(c.Object, "status", "phase")
			user, _, _ := unstructured.NestedString(c.Object, "spec", "user")
			return got == phase && user == "orders", fmt.Sprintf("status.phase %q, spec.user %q", got, user)
		})
	}
	setStatus("Provisioning")
	waitCopy("Provisioning")
	setStatus("Ready")
	waitCopy("Ready")
}
