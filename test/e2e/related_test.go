package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/watch"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/kubernetes"

	ferryv1alpha1 "github.com/ferry-dev/ferry/api/v1alpha1"
	"github.com/ferry-dev/ferry/pkg/naming"
	"github.com/ferry-dev/ferry/test/framework"
)

func serviceKube(t testing.TB) kubernetes.Interface {
	t.Helper()
	c, err := kubernetes.NewForConfig(env.service.Config)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// runSecretController plays cert-manager in the service cluster: for every
// object of res it creates a Secret named by the object's spec.secretName.
// It lists and watches again whenever its watch ends (an API server may end
// a watch at any time), so no object's Secret is missed.
func runSecretController(t testing.TB, res dynamic.NamespaceableResourceInterface, kube kubernetes.Interface) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	issue := func(u *unstructured.Unstructured) {
		name, _ := specField(u, "secretName")
		if name == "" {
			return
		}
		_, err := kube.CoreV1().Secrets(u.GetNamespace()).Create(ctx, &corev1.Secret{
			ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: u.GetNamespace(), Labels: map[string]string{"issued-by": "test-controller"}},
			Data:       map[string][]byte{"tls.crt": []byte("cert for " + u.GetName())},
		}, metav1.CreateOptions{})
		if err != nil && !apierrors.IsAlreadyExists(err) && ctx.Err() == nil {
			t.Errorf("test controller: %v", err)
		}
	}
	// listed lists res, issues every object's Secret and returns the
	// resourceVersion to watch from.
	listed := func() (string, error) {
		list, err := res.List(ctx, metav1.ListOptions{})
		if err != nil {
			return "", err
		}
		for i := range list.Items {
			issue(&list.Items[i])
		}
		return list.GetResourceVersion(), nil
	}
	rv, err := listed()
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		for ctx.Err() == nil {
			w, err := res.Watch(ctx, metav1.ListOptions{ResourceVersion: rv})
			if err == nil {
				for ev := range w.ResultChan() {
					u, ok := ev.Object.(*unstructured.Unstructured)
					if !ok || (ev.Type != watch.Added && ev.Type != watch.Modified) {
						continue
					}
					issue(u)
				}
				w.Stop()
			}
			if ctx.Err() != nil {
				return
			}
			time.Sleep(100 * time.Millisecond)
			if next, err := listed(); err == nil {
				rv = next
			}
		}
	}()
}

// waitFor polls check for up to a minute.
func waitFor(t testing.TB, what string, check func(ctx context.Context) (bool, string)) {
	t.Helper()
	if err := framework.Eventually(context.Background(), time.Minute, 100*time.Millisecond, check); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// waitSecretData waits until the Secret ns/name holds want under key.
func waitSecretData(t testing.TB, kube kubernetes.Interface, ns, name, key, want string) *corev1.Secret {
	t.Helper()
	var got *corev1.Secret
	waitFor(t, fmt.Sprintf("Secret %s/%s with %s=%q", ns, name, key, want), func(ctx context.Context) (bool, string) {
		s, err := kube.CoreV1().Secrets(ns).Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		got = s
		return string(s.Data[key]) == want, fmt.Sprintf("data %q", s.Data)
	})
	return got
}

// waitEvent waits for an Event with reason on the kcp object name whose
// message contains substr.
func waitEvent(t testing.TB, kube kubernetes.Interface, ns, name, reason, substr string) {
	t.Helper()
	waitFor(t, "event "+reason+" on "+name, func(ctx context.Context) (bool, string) {
		list, err := kube.CoreV1().Events(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			return false, err.Error()
		}
		var seen []string
		for _, ev := range list.Items {
			if ev.InvolvedObject.Name != name {
				continue
			}
			if ev.Reason == reason && strings.Contains(ev.Message, substr) {
				return true, ""
			}
			seen = append(seen, ev.Reason+": "+ev.Message)
		}
		return false, fmt.Sprintf("events: %q", seen)
	})
}

func TestRelatedSecretFromServiceCluster(t *testing.T) {
	ctx := context.Background()
	e := newSyncEnv(t, "certs.example.com", "Certificate", "certificates", func(s *ferryv1alpha1.PublishedResourceSpec) {
		// The local copy names another Secret than the kcp object does.
		s.Mutation = &ferryv1alpha1.ResourceMutationSpec{Spec: []ferryv1alpha1.ResourceMutation{
			{CEL: &ferryv1alpha1.CELMutation{Path: "spec.secretName",
				Expression: `has(remote.spec.secretName) ? "local-" + remote.spec.secretName : "local-unset"`}},
		}}
		s.Related = []ferryv1alpha1.RelatedResourceSpec{{
			Identifier: "tls", Origin: ferryv1alpha1.OriginService, Kind: "Secret",
			Reference: &ferryv1alpha1.RelatedResourceReference{Name: ferryv1alpha1.ResourceLocator{Path: "spec.secretName"}},
		}}
	})
	svc := serviceKube(t)
	runSecretController(t, e.local, svc)
	consumer := e.consumerKube(t)

	web := e.createRemote(t, "default", "web", map[string]any{"secretName": "web-tls"})
	// No secretName in kcp: the Secret exists locally, but the reference
	// cannot be evaluated on the kcp object; the kcp user is told, and the
	// other object syncs regardless.
	e.createRemote(t, "default", "nosecret", map[string]any{"other": "x"})

	local := e.waitLocal(t, "default", "web", func(u *unstructured.Unstructured) (bool, string) {
		v, _ := specField(u, "secretName")
		return v == "local-web-tls", "spec.secretName = " + v
	})
	waitFor(t, "the Secret in the service cluster", func(ctx context.Context) (bool, string) {
		_, err := svc.CoreV1().Secrets(local.GetNamespace()).Get(ctx, "local-web-tls", metav1.GetOptions{})
		return err == nil, fmt.Sprint(err)
	})
	// The copy appears in kcp under the kcp-side name.
	copyInKCP := waitSecretData(t, consumer, "default", "web-tls", "tls.crt", "cert for "+local.GetName())
	if got := copyInKCP.Labels[naming.LabelRelatedTo]; got != string(web.GetUID()) {
		t.Errorf("label %s = %q, want the primary's UID %s", naming.LabelRelatedTo, got, web.GetUID())
	}
	if copyInKCP.Labels["issued-by"] != "test-controller" {
		t.Errorf("labels of the local Secret not carried over: %v", copyInKCP.Labels)
	}
	if refs := copyInKCP.OwnerReferences; len(refs) != 1 || refs[0].UID != web.GetUID() {
		t.Errorf("owner references = %+v, want the primary", refs)
	}
	for k := range copyInKCP.Annotations {
		if strings.HasPrefix(k, "ferry.dev/") {
			t.Errorf("sync metadata leaked into kcp: annotation %s", k)
		}
	}

	// A change of the Secret's data shows up in kcp on its own.
	s, err := svc.CoreV1().Secrets(local.GetNamespace()).Get(ctx, "local-web-tls", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	s.Data["tls.crt"] = []byte("renewed")
	if _, err := svc.CoreV1().Secrets(s.Namespace).Update(ctx, s, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitSecretData(t, consumer, "default", "web-tls", "tls.crt", "renewed")

	// The service cluster is the source of truth: a copy deleted in kcp comes back.
	if err := consumer.CoreV1().Secrets("default").Delete(ctx, "web-tls", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitSecretData(t, consumer, "default", "web-tls", "tls.crt", "renewed")

	// A broker restart loses nothing: a change made while it is down arrives.
	if err := e.broker.Restart(ctx, true); err != nil {
		t.Fatal(err)
	}
	s, err = svc.CoreV1().Secrets(local.GetNamespace()).Get(ctx, "local-web-tls", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	s.Data["tls.crt"] = []byte("renewed again")
	if _, err := svc.CoreV1().Secrets(s.Namespace).Update(ctx, s, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitSecretData(t, consumer, "default", "web-tls", "tls.crt", "renewed again")

	waitEvent(t, consumer, "default", "nosecret", "RelatedUnresolved", `related "tls": reference.name: spec.secretName: path matches nothing`)
	e.waitLocal(t, "default", "nosecret", func(*unstructured.Unstructured) (bool, string) { return true, "" })

	// A Secret the consumer made is never overwritten: the kcp user is told.
	if _, err := consumer.CoreV1().Secrets("default").Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "taken"}, Data: map[string][]byte{"tls.crt": []byte("the consumer's own")},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.createRemote(t, "default", "clash", map[string]any{"secretName": "taken"})
	waitEvent(t, consumer, "default", "clash", "RelatedConflict", "Secret default/taken already exists in this workspace and was not created by ferry")
	if s, err := consumer.CoreV1().Secrets("default").Get(ctx, "taken", metav1.GetOptions{}); err != nil || string(s.Data["tls.crt"]) != "the consumer's own" {
		t.Errorf("the consumer's Secret was touched: %v %q", err, s.Data)
	}

	// The reference moves: the copy moves with it.
	patch := []byte(`{"spec":{"secretName":"web-tls-2"}}`)
	if _, err := e.remote.Namespace("default").Patch(ctx, "web", types.MergePatchType, patch, metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the copy at the new name, and none at the old one", func(ctx context.Context) (bool, string) {
		if _, err := consumer.CoreV1().Secrets("default").Get(ctx, "web-tls-2", metav1.GetOptions{}); err != nil {
			// Say where the chain stopped: the local copy's reference, the
			// local Secret it names.
			// A context of its own: the attempt's may be the one that
			// ran out, which would say nothing.
			dctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			local := "local copy: not found"
			copies, lerr := e.local.Namespace(e.consumerLC).List(dctx, metav1.ListOptions{})
			if lerr != nil {
				local = "local copies: " + lerr.Error()
			} else {
				for _, c := range copies.Items {
					if c.GetAnnotations()[naming.AnnotationName] == "web" {
						name, _ := specField(&c, "secretName")
						_, serr := svc.CoreV1().Secrets(c.GetNamespace()).Get(dctx, name, metav1.GetOptions{})
						local = fmt.Sprintf("local copy names Secret %s (get: %v)", name, serr)
					}
				}
			}
			return false, "new: " + err.Error() + "; " + local
		}
		_, err := consumer.CoreV1().Secrets("default").Get(ctx, "web-tls", metav1.GetOptions{})
		return apierrors.IsNotFound(err), fmt.Sprintf("old: %v", err)
	})

	// Deleting the primary deletes the copy in kcp before the finalizer goes.
	if err := e.remote.Namespace("default").Delete(ctx, "web", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	e.waitRemote(t, "default", "web", func(_ *unstructured.Unstructured, err error) (bool, string) {
		return apierrors.IsNotFound(err), fmt.Sprint(err)
	})
	if _, err := consumer.CoreV1().Secrets("default").Get(ctx, "web-tls-2", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("the related copy in kcp outlived its primary: %v", err)
	}
}

func TestRelatedObjectsFromKCP(t *testing.T) {
	ctx := context.Background()
	staticNS := "static-" + sanitize(t.Name())[:20]
	staticNS = strings.TrimRight(strings.ToLower(staticNS), "-")
	e := newSyncEnv(t, "backup.example.com", "Backup", "backups", func(s *ferryv1alpha1.PublishedResourceSpec) {
		s.Related = []ferryv1alpha1.RelatedResourceSpec{
			{
				Identifier: "credentials", Origin: ferryv1alpha1.OriginKCP, Kind: "Secret",
				Reference: &ferryv1alpha1.RelatedResourceReference{Name: ferryv1alpha1.ResourceLocator{Path: "spec.credentialsSecret"}},
			},
			{
				// A static namespace on both sides: an empty pattern injects the replacement.
				Identifier: "settings", Origin: ferryv1alpha1.OriginKCP, Kind: "ConfigMap",
				Reference: &ferryv1alpha1.RelatedResourceReference{
					Name:      ferryv1alpha1.ResourceLocator{Path: "spec.configName"},
					Namespace: &ferryv1alpha1.ResourceLocator{Path: "metadata.name", Regex: &ferryv1alpha1.RegexReplacement{Replacement: staticNS}},
				},
			},
		}
	})
	svc := serviceKube(t)
	consumer := e.consumerKube(t)
	if _, err := consumer.CoreV1().Secrets("default").Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: "creds", Labels: map[string]string{"kind": "db"}},
		Data:       map[string][]byte{"password": []byte("hunter2")},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := consumer.CoreV1().Namespaces().Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: staticNS}}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	e.createRemote(t, "default", "nightly", map[string]any{"credentialsSecret": "creds", "configName": "settings"})
	local := e.waitLocal(t, "default", "nightly", func(*unstructured.Unstructured) (bool, string) { return true, "" })

	waitFor(t, "the Secret in the service cluster", func(ctx context.Context) (bool, string) {
		s, err := svc.CoreV1().Secrets(local.GetNamespace()).Get(ctx, "creds", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		return string(s.Data["password"]) == "hunter2" && s.Labels["kind"] == "db", fmt.Sprintf("data %q labels %v", s.Data, s.Labels)
	})
	// A copy deleted in the service cluster by someone else comes back.
	if err := svc.CoreV1().Secrets(local.GetNamespace()).Delete(ctx, "creds", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitSecretData(t, svc, local.GetNamespace(), "creds", "password", "hunter2")
	// A copy edited in the service cluster in a field ferry wrote is
	// repaired too; a key another manager added is theirs and stays.
	edited, err := svc.CoreV1().Secrets(local.GetNamespace()).Get(ctx, "creds", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	edited.Data["password"] = []byte("tampered")
	edited.Data["extra"] = []byte("theirs")
	if _, err := svc.CoreV1().Secrets(local.GetNamespace()).Update(ctx, edited, metav1.UpdateOptions{FieldManager: "someone-else"}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the edited Secret repaired, the other manager's key kept", func(ctx context.Context) (bool, string) {
		s, err := svc.CoreV1().Secrets(local.GetNamespace()).Get(ctx, "creds", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		return string(s.Data["password"]) == "hunter2" && string(s.Data["extra"]) == "theirs", fmt.Sprintf("data %q", s.Data)
	})
	resendsAsked := func() float64 {
		v, _ := scrapeBoth(t, e).broker.Value("ferry_broker_reports_received_total", map[string]string{"export": e.export.String(), "kind": "resend"})
		return v
	}
	resends := resendsAsked()
	// The ConfigMap does not exist yet: the kcp user is told what is missing.
	waitEvent(t, consumer, "default", "nightly", "RelatedMissing", fmt.Sprintf(`related "settings": waiting for ConfigMap %s/settings`, staticNS))
	if _, err := consumer.CoreV1().ConfigMaps(staticNS).Create(ctx, &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: "settings"}, Data: map[string]string{"retention": "7d"},
	}, metav1.CreateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the ConfigMap in the static namespace of the service cluster", func(ctx context.Context) (bool, string) {
		cm, err := svc.CoreV1().ConfigMaps(staticNS).Get(ctx, "settings", metav1.GetOptions{})
		if err != nil {
			return false, err.Error()
		}
		return cm.Data["retention"] == "7d", fmt.Sprintf("data %v", cm.Data)
	})

	// Updates flow down on their own.
	s, err := consumer.CoreV1().Secrets("default").Get(ctx, "creds", metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	s.Data["password"] = []byte("correct horse")
	if _, err := consumer.CoreV1().Secrets("default").Update(ctx, s, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitSecretData(t, svc, local.GetNamespace(), "creds", "password", "correct horse")
	// ferry's own writes are never taken for local edits.
	if n := resendsAsked() - resends; n != 0 {
		t.Errorf("the edge asked for related objects again %v times after ferry's own writes", n)
	}

	// Deleting the primary removes the related copies, then the finalizer.
	if err := e.remote.Namespace("default").Delete(ctx, "nightly", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	e.waitRemote(t, "default", "nightly", func(_ *unstructured.Unstructured, err error) (bool, string) {
		return apierrors.IsNotFound(err), fmt.Sprint(err)
	})
	if _, err := svc.CoreV1().Secrets(local.GetNamespace()).Get(ctx, "creds", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("the local Secret outlived its primary: %v", err)
	}
	if _, err := svc.CoreV1().ConfigMaps(staticNS).Get(ctx, "settings", metav1.GetOptions{}); !apierrors.IsNotFound(err) {
		t.Errorf("the local ConfigMap outlived its primary: %v", err)
	}
	// The consumer's own objects stay.
	if _, err := consumer.CoreV1().Secrets("default").Get(ctx, "creds", metav1.GetOptions{}); err != nil {
		t.Errorf("the consumer's Secret: %v", err)
	}
}

func TestInvalidRelatedGetsCondition(t *testing.T) {
	p := newPubEnv(t)
	apply(t, testCRD("badrel.example.com", "Gadget", "gadgets", "Namespaced", "v1"))
	p.publish(t, "bad-related", ferryv1alpha1.PublishedResourceSpec{
		Resource: ferryv1alpha1.SourceResource{APIGroup: "badrel.example.com", Kind: "Gadget", Version: "v1"},
		Related: []ferryv1alpha1.RelatedResourceSpec{{
			Identifier: "creds", Origin: ferryv1alpha1.OriginService, Kind: "Secret",
			Reference: &ferryv1alpha1.RelatedResourceReference{Name: ferryv1alpha1.ResourceLocator{
				Path: "spec.secretName", Regex: &ferryv1alpha1.RegexReplacement{Pattern: "(unclosed", Replacement: "x"},
			}},
		}},
	})
	pr := p.waitCondition(t, "bad-related", metav1.ConditionFalse, ferryv1alpha1.ReasonRelatedInvalid)
	if msg := pr.Status.Conditions[0].Message; !strings.Contains(msg, "spec.related[creds]: reference.name.regex.pattern") {
		t.Errorf("condition message %q does not name the field", msg)
	}
	apply(t, testCRD("badrel.example.com", "Widget", "widgets", "Namespaced", "v1")) // one PublishedResource per CRD
	p.publish(t, "unknown-related-kind", ferryv1alpha1.PublishedResourceSpec{
		Resource:   ferryv1alpha1.SourceResource{APIGroup: "badrel.example.com", Kind: "Widget", Version: "v1"},
		Projection: &ferryv1alpha1.ResourceProjection{Kind: "Gizmo"},
		Related: []ferryv1alpha1.RelatedResourceSpec{{
			Identifier: "creds", Origin: ferryv1alpha1.OriginKCP, Kind: "Sekret",
			Reference: &ferryv1alpha1.RelatedResourceReference{Name: ferryv1alpha1.ResourceLocator{Path: "spec.secretName"}},
		}},
	})
	pr = p.waitCondition(t, "unknown-related-kind", metav1.ConditionFalse, ferryv1alpha1.ReasonRelatedInvalid)
	if msg := pr.Status.Conditions[0].Message; !strings.Contains(msg, "kind /v1, Kind=Sekret is not served by the service cluster") {
		t.Errorf("condition message %q does not name the kind", msg)
	}
}
