package replication

import (
	"context"
	"testing"

	"google.golang.org/protobuf/proto"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	dynamicfake "k8s.io/client-go/dynamic/fake"
	kubefake "k8s.io/client-go/kubernetes/fake"

	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
	ferryv1alpha1 "github.com/ferry-dev/ferry/api/v1alpha1"
	"github.com/ferry-dev/ferry/pkg/naming"
)

// FuzzIntent decodes arbitrary bytes as a sync intent from the broker and
// runs it through the edge's apply path against fake clients: no panic,
// and no write outside what the PublishedResource allows — nothing in
// kube-system or in another workspace's namespace, nothing of a kind it
// does not publish, and no namespace but one labelled for the intent's
// workspace.
func FuzzIntent(f *testing.F) {
	key, _ := remoteThing()
	for _, in := range []*ferryv1.SyncIntent{
		{Key: key, PublishedResource: "pr", Version: &ferryv1.ObjectVersion{Sequence: 1},
			Operation: &ferryv1.SyncIntent_Upsert{Upsert: &ferryv1.UpsertIntent{Object: []byte(`{"spec":{"a":1}}`)}}},
		{Key: &ferryv1.ObjectKey{Cluster: "kube-system", Resource: key.GetResource(), Namespace: "x", Name: "y", Uid: "u"}, PublishedResource: "pr",
			Operation: &ferryv1.SyncIntent_Upsert{Upsert: &ferryv1.UpsertIntent{Object: []byte(`{"metadata":{"namespace":"kube-system"}}`)}}},
		{Key: key, PublishedResource: "pr", Operation: &ferryv1.SyncIntent_Delete{Delete: &ferryv1.DeleteIntent{}}},
		{Key: key, PublishedResource: "pr", RelatedTo: &ferryv1.RelatedTo{Primary: key, Identifier: "creds"},
			Operation: &ferryv1.SyncIntent_Upsert{Upsert: &ferryv1.UpsertIntent{Object: []byte(`{"data":{}}`)}}},
		{Key: &ferryv1.ObjectKey{Cluster: "c1", Resource: &ferryv1.GroupVersionResource{Group: "rbac.authorization.k8s.io", Version: "v1", Resource: "clusterrolebindings"}, Name: "admin"},
			Operation: &ferryv1.SyncIntent_Upsert{Upsert: &ferryv1.UpsertIntent{Object: []byte(`{}`)}}},
	} {
		data, err := proto.Marshal(in)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var in ferryv1.SyncIntent
		if err := proto.Unmarshal(data, &in); err != nil {
			return
		}
		e, _, sink := testEngine(t, true)
		kube := e.opts.Kube.(*kubefake.Clientset)
		for _, ns := range []*corev1.Namespace{
			{ObjectMeta: metav1.ObjectMeta{Name: "kube-system"}},
			{ObjectMeta: metav1.ObjectMeta{Name: "tenant-b", Labels: map[string]string{naming.LabelAgent: "nora", naming.LabelWorkspace: "c9"}}},
		} {
			if _, err := kube.CoreV1().Namespaces().Create(context.Background(), ns, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		kube.ClearActions()
		e.Handle(&in)
		runQueue(t, e)
		if len(sink.msgs) > 1 {
			t.Fatalf("more than one answer to one intent: %v", sink.msgs)
		}
		cluster := in.GetKey().GetCluster()
		for _, a := range e.opts.Dynamic.(*dynamicfake.FakeDynamicClient).Actions() {
			if a.GetVerb() == "list" || a.GetVerb() == "get" || a.GetVerb() == "watch" {
				continue
			}
			if a.GetResource() == ferryv1alpha1.GroupVersion.WithResource("publishedresources") && a.GetSubresource() == "status" {
				continue // the PublishedResource's status: its Synced condition and counts
			}
			if a.GetResource() != localGVR {
				t.Fatalf("wrote %s, which no PublishedResource publishes", a.GetResource())
			}
			switch ns := a.GetNamespace(); {
			case ns == "kube-system":
				t.Fatalf("wrote into kube-system for cluster %q", cluster)
			case ns == "tenant-b" && cluster != "c9":
				t.Fatalf("wrote into workspace c9's namespace for cluster %q", cluster)
			}
		}
		for _, a := range kube.Actions() {
			if a.GetVerb() != "create" {
				continue
			}
			ns := a.(interface{ GetObject() runtime.Object }).GetObject().(*corev1.Namespace)
			if ns.Labels[naming.LabelWorkspace] != cluster || ns.Labels[naming.LabelAgent] != "nora" {
				t.Fatalf("created namespace %s labelled %v for cluster %q", ns.Name, ns.Labels, cluster)
			}
		}
	})
}
