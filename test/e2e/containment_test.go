package e2e

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"slices"
	"sort"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/kubernetes"

	ferryv1alpha1 "github.com/ferry-dev/ferry/api/v1alpha1"
	"github.com/ferry-dev/ferry/pkg/naming"
)

// Tenant containment of related objects: a consumer writes the spec that
// related references are evaluated on, so a reference must never reach
// another tenant's objects or the service cluster's own, and a service-side
// object several primaries point at is copied for none of them.

// remoteToCreate is one kcp object for createRemotesAtOnce.
type remoteToCreate struct {
	e        *syncEnv
	ns, name string
	spec     map[string]any
}

// createRemotesAtOnce creates the kcp objects in parallel.
func createRemotesAtOnce(t testing.TB, objs ...*remoteToCreate) {
	t.Helper()
	var wg sync.WaitGroup
	for _, o := range objs {
		wg.Go(func() {
			u := &unstructured.Unstructured{Object: map[string]any{
				"apiVersion": o.e.remoteGVR.GroupVersion().String(), "kind": o.e.remoteKind,
				"metadata": map[string]any{"name": o.name, "namespace": o.ns},
				"spec":     o.spec,
			}}
			if _, err := o.e.remote.Namespace(o.ns).Create(context.Background(), u, metav1.CreateOptions{}); err != nil {
				t.Errorf("creating %s/%s in %s: %v", o.ns, o.name, o.e.consumer, err)
			}
		})
	}
	wg.Wait()
	if t.Failed() {
		t.FailNow()
	}
}

// holdingFor fails the test as soon as check does not hold, and returns
// once it held for d (checked every second).
func holdingFor(t testing.TB, what string, d time.Duration, check func(ctx context.Context) (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		ok, reason := check(ctx)
		cancel()
		if !ok {
			t.Fatalf("%s stopped holding: %s", what, reason)
		}
		if time.Now().After(deadline) {
			return
		}
		time.Sleep(time.Second)
	}
}

// secretsNamedIn lists the Secrets of every namespace of a workspace whose
// name is one of names, or which ferry labelled as a related copy.
func secretsNamedIn(ctx context.Context, kube kubernetes.Interface, names ...string) ([]string, error) {
	list, err := kube.CoreV1().Secrets("").List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, err
	}
	var found []string
	for _, s := range list.Items {
		if _, labelled := s.Labels[naming.LabelRelatedTo]; labelled || slices.Contains(names, s.Name) {
			found = append(found, s.Namespace+"/"+s.Name)
		}
	}
	sort.Strings(found)
	return found, nil
}

func sameSecretData(a, b map[string][]byte) bool { return maps.EqualFunc(a, b, bytes.Equal) }

func TestRelatedReferencesCannotReachOtherTenants(t *testing.T) {
	ctx := context.Background()
	sfx := naming.Hash(t.Name())[:6]
	// Workspace B (the victim) and workspace A (the consumer reaching out)
	// share one PublishedResource; the consumer names the Secret's namespace.
	b := newSyncEnv(t, "reach.containment.example.com", "ReachCert", "reachcerts", func(s *ferryv1alpha1.PublishedResourceSpec) {
		s.Related = []ferryv1alpha1.RelatedResourceSpec{{
			Identifier: "tls", Origin: ferryv1alpha1.OriginService, Kind: "Secret",
			Reference: &ferryv1alpha1.RelatedResourceReference{
				Name:      ferryv1alpha1.ResourceLocator{Path: "spec.secretName"},
				Namespace: &ferryv1alpha1.ResourceLocator{Path: "spec.secretNamespace"},
			},
		}}
	})
	a := *b
	a.useConsumer(t, bindConsumer(t, b.pubEnv, "a"))
	svc := serviceKube(t)
	consumerA, consumerB := a.consumerKube(t), b.consumerKube(t)

	// B's primary lands in B's local namespace (default naming) and
	// legitimately references B's Secret there.
	b.createRemote(t, "default", "own", map[string]any{"secretName": "b-secret", "secretNamespace": b.consumerLC})
	bLocal := b.waitLocal(t, "default", "own", func(*unstructured.Unstructured) (bool, string) { return true, "" })
	if bLocal.GetNamespace() != b.consumerLC {
		t.Fatalf("B's copy is in namespace %s, want B's logical cluster %s", bLocal.GetNamespace(), b.consumerLC)
	}
	sysName := "reach-sys-" + sfx
	bSecret, err := svc.CoreV1().Secrets(b.consumerLC).Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "b-secret"}, Data: map[string][]byte{"tls.key": []byte("B's private key")},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	sysSecret, err := svc.CoreV1().Secrets("kube-system").Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: sysName}, Data: map[string][]byte{"token": []byte("the service cluster's own")},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = svc.CoreV1().Secrets("kube-system").Delete(context.Background(), sysName, metav1.DeleteOptions{})
	})
	waitSecretData(t, consumerB, b.consumerLC, "b-secret", "tls.key", "B's private key")

	// A points at B's local namespace and at kube-system.
	createRemotesAtOnce(t,
		&remoteToCreate{e: &a, ns: "default", name: "steal-b", spec: map[string]any{"secretName": "b-secret", "secretNamespace": b.consumerLC}},
		&remoteToCreate{e: &a, ns: "default", name: "steal-sys", spec: map[string]any{"secretName": sysName, "secretNamespace": "kube-system"}},
	)
	waitEvent(t, consumerA, "default", "steal-b", "RelatedForbidden", "namespace "+b.consumerLC+" belongs to another workspace")
	waitEvent(t, consumerA, "default", "steal-sys", "RelatedForbidden", "namespace kube-system")

	holdingFor(t, "no Secret reaches workspace A", 5*time.Second, func(ctx context.Context) (bool, string) {
		found, err := secretsNamedIn(ctx, consumerA, "b-secret", sysName)
		if err != nil {
			return false, err.Error()
		}
		return len(found) == 0, fmt.Sprintf("Secrets in A: %v", found)
	})
	for _, before := range []*corev1.Secret{bSecret, sysSecret} {
		now, err := svc.CoreV1().Secrets(before.Namespace).Get(ctx, before.Name, metav1.GetOptions{})
		if err != nil {
			t.Errorf("Secret %s/%s in the service cluster: %v", before.Namespace, before.Name, err)
			continue
		}
		if now.ResourceVersion != before.ResourceVersion || !sameSecretData(now.Data, before.Data) {
			t.Errorf("Secret %s/%s in the service cluster changed: resourceVersion %s -> %s, data %q -> %q",
				before.Namespace, before.Name, before.ResourceVersion, now.ResourceVersion, before.Data, now.Data)
		}
	}
	// A's attempt costs B nothing: its copy stays.
	if s, err := consumerB.CoreV1().Secrets(b.consumerLC).Get(ctx, "b-secret", metav1.GetOptions{}); err != nil || string(s.Data["tls.key"]) != "B's private key" {
		t.Errorf("B's own copy after A's attempt: %v", err)
	}
}

func TestSharedRelatedSecretConflicts(t *testing.T) {
	fixedNS := "acc-cm-" + naming.Hash(t.Name())[:6]
	certSpec := func(mutate bool) func(*ferryv1alpha1.PublishedResourceSpec) {
		return func(s *ferryv1alpha1.PublishedResourceSpec) {
			s.Naming = &ferryv1alpha1.ResourceNaming{Namespace: fixedNS, Name: "$remoteClusterName-$remoteNamespaceHash-$remoteNameHash"}
			s.Related = []ferryv1alpha1.RelatedResourceSpec{{
				Identifier: "tls", Origin: ferryv1alpha1.OriginService, Kind: "Secret",
				Reference: &ferryv1alpha1.RelatedResourceReference{Name: ferryv1alpha1.ResourceLocator{Path: "spec.secretName"}},
			}}
			if mutate {
				// The README's fix: the local Secret is named after the local copy.
				s.Mutation = &ferryv1alpha1.ResourceMutationSpec{Spec: []ferryv1alpha1.ResourceMutation{
					{Template: &ferryv1alpha1.TemplateMutation{Path: "spec.secretName", Template: "{{ .Object.metadata.name }}-tls"}},
				}}
			}
		}
	}
	envs := newSyncEnvs(t, "c",
		publication{crd: testCRD("shared.containment.example.com", "SharedCert", "sharedcerts", apiextensionsv1.NamespaceScoped, "v1"), spec: certSpec(false)},
		publication{crd: testCRD("unique.containment.example.com", "UniqueCert", "uniquecerts", apiextensionsv1.NamespaceScoped, "v1"), spec: certSpec(true)},
	)
	shared1, unique1 := envs[0], envs[1]
	second := bindConsumer(t, shared1.pubEnv, "d")
	shared2, unique2 := *shared1, *unique1
	shared2.useConsumer(t, second)
	unique2.useConsumer(t, second)
	svc := serviceKube(t)
	// cert-manager: a Secret for every local Certificate, data naming the copy.
	runSecretController(t, shared1.local, svc)
	runSecretController(t, unique1.local, svc)
	kube1, kube2 := shared1.consumerKube(t), shared2.consumerKube(t)

	// Without the mutation, both local copies name acc-cm/app-cert.
	createRemotesAtOnce(t,
		&remoteToCreate{e: shared1, ns: "default", name: "app", spec: map[string]any{"secretName": "app-cert"}},
		&remoteToCreate{e: &shared2, ns: "default", name: "app", spec: map[string]any{"secretName": "app-cert"}},
	)
	for _, e := range []*syncEnv{shared1, &shared2} {
		l := e.waitLocal(t, "default", "app", func(*unstructured.Unstructured) (bool, string) { return true, "" })
		if l.GetNamespace() != fixedNS {
			t.Errorf("local copy of %s's default/app is in %s, want %s", e.consumer, l.GetNamespace(), fixedNS)
		}
	}
	waitFor(t, "the shared Secret in the service cluster", func(ctx context.Context) (bool, string) {
		_, err := svc.CoreV1().Secrets(fixedNS).Get(ctx, "app-cert", metav1.GetOptions{})
		return err == nil, fmt.Sprint(err) // its data names whichever copy came first
	})
	for _, kube := range []kubernetes.Interface{kube1, kube2} {
		waitEvent(t, kube, "default", "app", "RelatedConflict", fmt.Sprintf("Secret %s/app-cert in the service cluster is referenced by 2 objects", fixedNS))
	}
	// A copy written before the second reference appeared is removed; none
	// comes back.
	noSharedCopy := func(ctx context.Context) (bool, string) {
		for i, kube := range []kubernetes.Interface{kube1, kube2} {
			s, err := kube.CoreV1().Secrets("default").Get(ctx, "app-cert", metav1.GetOptions{})
			if !apierrors.IsNotFound(err) {
				return false, fmt.Sprintf("workspace %d has default/app-cert: %v %q", i+1, err, s.Data)
			}
		}
		return true, ""
	}
	waitFor(t, "no workspace holds the shared Secret", noSharedCopy)
	holdingFor(t, "no workspace holds the shared Secret", 5*time.Second, noSharedCopy)

	// With the mutation, each local copy names its own Secret, and each
	// workspace receives its own key under the name it asked for.
	createRemotesAtOnce(t,
		&remoteToCreate{e: unique1, ns: "default", name: "app", spec: map[string]any{"secretName": "app-cert"}},
		&remoteToCreate{e: &unique2, ns: "default", name: "app", spec: map[string]any{"secretName": "app-cert"}},
	)
	var localNames []string
	for _, w := range []struct {
		e    *syncEnv
		kube kubernetes.Interface
	}{{unique1, kube1}, {&unique2, kube2}} {
		l := w.e.waitLocal(t, "default", "app", func(u *unstructured.Unstructured) (bool, string) {
			v, _ := specField(u, "secretName")
			return v == u.GetName()+"-tls", "spec.secretName = " + v
		})
		localNames = append(localNames, l.GetName())
		s := waitSecretData(t, w.kube, "default", "app-cert", "tls.crt", "cert for "+l.GetName())
		if want := map[string][]byte{"tls.crt": []byte("cert for " + l.GetName())}; !sameSecretData(s.Data, want) {
			t.Errorf("%s: default/app-cert holds %q, want only its own copy's %q", w.e.consumer, s.Data, want)
		}
	}
	if localNames[0] == localNames[1] {
		t.Errorf("both workspaces' copies are named %s", localNames[0])
	}
}

func TestRelatedCopyOutsidePrimaryNamespaceHolds(t *testing.T) {
	ctx := context.Background()
	sfx := naming.Hash(t.Name())[:6]
	// preNS exists in the workspace beforehand, freshNS does not: the broker
	// creates it. Both are named statically, so they are the same on both
	// sides.
	preNS, freshNS := "held-pre-"+sfx, "held-new-"+sfx
	staticEntry := func(id, ns string) ferryv1alpha1.RelatedResourceSpec {
		return ferryv1alpha1.RelatedResourceSpec{
			Identifier: id, Origin: ferryv1alpha1.OriginService, Kind: "Secret",
			Reference: &ferryv1alpha1.RelatedResourceReference{
				Name:      ferryv1alpha1.ResourceLocator{Path: "spec.secretName"},
				Namespace: &ferryv1alpha1.ResourceLocator{Path: "metadata.name", Regex: &ferryv1alpha1.RegexReplacement{Replacement: ns}},
			},
		}
	}
	e := newSyncEnv(t, "held.containment.example.com", "HeldCert", "heldcerts", func(s *ferryv1alpha1.PublishedResourceSpec) {
		s.Related = []ferryv1alpha1.RelatedResourceSpec{staticEntry("pre", preNS), staticEntry("fresh", freshNS)}
	})
	svc := serviceKube(t)
	consumer := e.consumerKube(t)
	for _, ns := range []string{preNS, freshNS} {
		if _, err := svc.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}, metav1.CreateOptions{}); err != nil && !apierrors.IsAlreadyExists(err) {
			t.Fatal(err)
		}
		if _, err := svc.CoreV1().Secrets(ns).Create(ctx, &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: "held"}, Data: map[string][]byte{"tls.crt": []byte("cert in " + ns)},
		}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := consumer.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: preNS}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	primary := e.createRemote(t, "default", "holder", map[string]any{"secretName": "held"})

	versions := map[string]string{}
	for _, c := range []struct{ id, ns string }{{"pre", preNS}, {"fresh", freshNS}} {
		s := waitSecretData(t, consumer, c.ns, "held", "tls.crt", "cert in "+c.ns)
		if s.Labels[naming.LabelRelatedTo] != string(primary.GetUID()) || s.Labels[naming.LabelRelatedIdentifier] != c.id {
			t.Errorf("copy %s/held: labels %v, want %s=%s and %s=%s", c.ns, s.Labels,
				naming.LabelRelatedTo, primary.GetUID(), naming.LabelRelatedIdentifier, c.id)
		}
		if len(s.OwnerReferences) != 0 {
			t.Errorf("copy %s/held outside the primary's namespace has owner references %+v", c.ns, s.OwnerReferences)
		}
		versions[c.ns] = s.ResourceVersion
	}

	// The copies stay as written: nothing deletes and recreates or rewrites
	// them.
	holdingFor(t, "both copies unchanged", time.Minute, func(ctx context.Context) (bool, string) {
		for ns, rv := range versions {
			s, err := consumer.CoreV1().Secrets(ns).Get(ctx, "held", metav1.GetOptions{})
			if err != nil {
				return false, fmt.Sprintf("%s/held: %v", ns, err)
			}
			if s.ResourceVersion != rv || len(s.OwnerReferences) != 0 {
				return false, fmt.Sprintf("%s/held: resourceVersion %s -> %s, owner references %+v", ns, rv, s.ResourceVersion, s.OwnerReferences)
			}
		}
		return true, ""
	})

	// Deleting the primary deletes both copies before its finalizer goes.
	if err := e.remote.Namespace("default").Delete(ctx, "holder", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	e.waitRemote(t, "default", "holder", func(_ *unstructured.Unstructured, err error) (bool, string) {
		return apierrors.IsNotFound(err), fmt.Sprint(err)
	})
	for ns := range versions {
		if _, err := consumer.CoreV1().Secrets(ns).Get(ctx, "held", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
			t.Errorf("the copy %s/held outlived its primary: %v", ns, err)
		}
	}
}
