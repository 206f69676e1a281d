package replication

import (
	"context"
	"reflect"
	"testing"

	"google.golang.org/protobuf/proto"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
	ferryv1alpha1 "github.com/ferry-dev/ferry/api/v1alpha1"
	"github.com/ferry-dev/ferry/pkg/related"
)

// FuzzReport decodes arbitrary bytes as an edge message and runs the
// broker's report handling (status, deletion confirmation, related object)
// against a fake kcp: no panic, and nothing written into an object the
// broker does not sync for this edge ("b": no finalizer), no finalizer
// released from an object the broker did not ask to delete ("a": synced,
// not deleting).
func FuzzReport(f *testing.F) {
	a := thingKey()
	b := &ferryv1.ObjectKey{Cluster: "c", Resource: a.GetResource(), Namespace: "ns", Name: "b", Uid: "u-b"}
	for _, m := range []*ferryv1.ConnectRequest{
		{Message: &ferryv1.ConnectRequest_StatusReport{StatusReport: &ferryv1.StatusReport{Key: a, Status: []byte(`{"ready":true}`)}}},
		{Message: &ferryv1.ConnectRequest_StatusReport{StatusReport: &ferryv1.StatusReport{Key: b, Status: []byte(`{"ready":true}`)}}},
		{Message: &ferryv1.ConnectRequest_DeletionConfirmation{DeletionConfirmation: &ferryv1.DeletionConfirmation{Key: a}}},
		{Message: &ferryv1.ConnectRequest_RelatedObjectReport{RelatedObjectReport: &ferryv1.RelatedObjectReport{
			RelatedTo: &ferryv1.RelatedTo{Primary: b, Identifier: "tls"},
			State:     &ferryv1.RelatedObjectReport_Object{Object: []byte(`{"data":{"k":"dg=="}}`)}}}},
		{Message: &ferryv1.ConnectRequest_RelatedObjectReport{RelatedObjectReport: &ferryv1.RelatedObjectReport{
			RelatedTo: &ferryv1.RelatedTo{Primary: a, Identifier: "tls"},
			State:     &ferryv1.RelatedObjectReport_Gone{Gone: &ferryv1.RelatedObjectGone{}}}}},
	} {
		data, err := proto.Marshal(m)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(data)
	}
	refs, err := related.Compile([]ferryv1alpha1.RelatedResourceSpec{{
		Identifier: "tls", Origin: ferryv1alpha1.OriginService, Kind: "Secret",
		Reference: &ferryv1alpha1.RelatedResourceReference{Name: ferryv1alpha1.ResourceLocator{Path: "spec.secretName"}},
	}})
	if err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		var msg ferryv1.ConnectRequest
		if err := proto.Unmarshal(data, &msg); err != nil {
			return
		}
		synced := thing("1", map[string]any{"secretName": "s"}, nil)
		foreign := withoutFinalizer(thing("1", map[string]any{"secretName": "s"}, nil))
		foreign.SetName("b")
		foreign.SetUID("u-b")
		res := thingsResource()
		res.Related, res.HasStatus = refs, true
		// Every workspace's requests reach the fake kcp.
		e := newEnv(t, res, synced, foreign)
		m, client, secrets := e.m, e.kcp, refs[0].Resource
		ctx := context.Background()
		switch r := msg.GetMessage().(type) {
		case *ferryv1.ConnectRequest_StatusReport:
			_, _ = m.WriteStatus(ctx, "pr", r.StatusReport.GetKey(), r.StatusReport.GetStatus())
		case *ferryv1.ConnectRequest_DeletionConfirmation:
			_ = m.Release(ctx, "pr", r.DeletionConfirmation.GetKey())
		case *ferryv1.ConnectRequest_RelatedObjectReport:
			if r.RelatedObjectReport.GetRelatedTo().GetPrimary() == nil {
				return // refused by the engine before the manager
			}
			_ = m.WriteRelated(ctx, "pr", r.RelatedObjectReport)
		default:
			return
		}
		gotB, err := client.Resource(thingsGVR).Namespace("ns").Get(ctx, "b", metav1.GetOptions{})
		if err != nil || !reflect.DeepEqual(gotB.Object, foreign.Object) {
			t.Fatalf("an object the broker does not sync was changed: %v %v", err, gotB)
		}
		gotA, err := client.Resource(thingsGVR).Namespace("ns").Get(ctx, "a", metav1.GetOptions{})
		if err != nil || !reflect.DeepEqual(gotA.GetFinalizers(), synced.GetFinalizers()) {
			t.Fatalf("the finalizer of an object not being deleted was touched: %v %v", err, gotA)
		}
		list, err := client.Resource(secrets).List(ctx, metav1.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		for _, s := range list.Items {
			if s.GetLabels()["ferry.dev/related-to"] != "u-a" {
				t.Fatalf("a related copy for an object the broker does not sync: %v", s.GetLabels())
			}
		}
	})
}
