package e2e

import (
	"context"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	ferryv1alpha1 "github.com/ferry-dev/ferry/api/v1alpha1"
)

// TestRelatedWatchLabelSelector: a service-origin related entry with
// watch.labelSelector. The edge caches only Secrets with the label: the
// labelled Secret a primary names is copied into kcp; an unlabelled one
// another primary names is not (its Event says which labels the edge
// looks for), and once labelled it appears by itself.
func TestRelatedWatchLabelSelector(t *testing.T) {
	ctx := context.Background()
	e := newSyncEnv(t, "watchsel.example.com", "Beacon", "beacons", func(s *ferryv1alpha1.PublishedResourceSpec) {
		s.Related = []ferryv1alpha1.RelatedResourceSpec{{
			Identifier: "tls", Origin: ferryv1alpha1.OriginService, Kind: "Secret",
			Reference: &ferryv1alpha1.RelatedResourceReference{Name: ferryv1alpha1.ResourceLocator{Path: "spec.secretName"}},
			Watch: &ferryv1alpha1.RelatedResourceWatch{LabelSelector: metav1.LabelSelector{
				MatchLabels: map[string]string{"issued-by": "beacon-operator"},
			}},
		}}
	})
	svc := serviceKube(t)
	consumer := e.consumerKube(t)
	e.createRemote(t, "default", "lit", map[string]any{"secretName": "lit-tls"})
	e.createRemote(t, "default", "dark", map[string]any{"secretName": "dark-tls"})
	lit := e.waitLocal(t, "default", "lit", func(*unstructured.Unstructured) (bool, string) { return true, "" })
	dark := e.waitLocal(t, "default", "dark", func(*unstructured.Unstructured) (bool, string) { return true, "" })

	// The service's controller labels its Secrets; someone else's Secret
	// of the same name pattern is not labelled.
	secret := func(ns, name string, labels map[string]string) {
		t.Helper()
		if _, err := svc.CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: name, Labels: labels}, Data: map[string][]byte{"tls.crt": []byte("cert for " + name)},
		}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	secret(lit.GetNamespace(), "lit-tls", map[string]string{"issued-by": "beacon-operator"})
	secret(dark.GetNamespace(), "dark-tls", nil)

	waitSecretData(t, consumer, "default", "lit-tls", "tls.crt", "cert for lit-tls")
	waitEvent(t, consumer, "default", "dark", "RelatedMissing",
		`related "tls": waiting for Secret `+dark.GetNamespace()+`/dark-tls in the service cluster with the labels issued-by=beacon-operator`)
	// By now the edge has reported the unlabelled Secret as absent; its
	// copy must not exist (the lit one took the same path and arrived).
	time.Sleep(2 * time.Second)
	if _, err := consumer.CoreV1().Secrets("default").Get(ctx, "dark-tls", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Fatalf("the unlabelled Secret reached kcp: %v", err)
	}

	// Labelled later: it appears by itself.
	s, err := svc.CoreV1().Secrets(dark.GetNamespace()).Get(ctx, "dark-tls", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	s.Labels = map[string]string{"issued-by": "beacon-operator"}
	if _, err := svc.CoreV1().Secrets(s.Namespace).Update(ctx, s, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitSecretData(t, consumer, "default", "dark-tls", "tls.crt", "cert for dark-tls")
}
