package replication

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	ferryv1alpha1 "github.com/ferry-dev/ferry/api/v1alpha1"
	"github.com/ferry-dev/ferry/pkg/related"
)

// TestRelatedMissingNamesTheWatchSelector: a service-origin related object
// the edge does not find is a RelatedMissing Event; with
// watch.labelSelector the Event names the labels, since an existing object
// without them looks absent.
func TestRelatedMissingNamesTheWatchSelector(t *testing.T) {
	for _, tc := range []struct {
		name  string
		watch *ferryv1alpha1.RelatedResourceWatch
		want  string
	}{
		{name: "no watch", want: `related "creds": waiting for Secret ns-1/db-creds in the service cluster`},
		{name: "watch.labelSelector", watch: &ferryv1alpha1.RelatedResourceWatch{LabelSelector: metav1.LabelSelector{MatchLabels: map[string]string{"managed-by": "db-operator"}}},
			want: `related "creds": waiting for Secret ns-1/db-creds in the service cluster with the labels managed-by=db-operator (the entry's watch.labelSelector: the edge finds only objects that carry them)`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			refs, err := related.Compile([]ferryv1alpha1.RelatedResourceSpec{{
				Identifier: "creds", Origin: ferryv1alpha1.OriginService, Kind: "Secret", Watch: tc.watch,
				Reference: &ferryv1alpha1.RelatedResourceReference{Name: ferryv1alpha1.ResourceLocator{Path: "spec.secretName"}},
			}})
			if err != nil {
				t.Fatal(err)
			}
			if got := relatedMissingMessage(refs[0], "ns-1", "db-creds"); got != tc.want {
				t.Errorf("message\n %s\nwant\n %s", got, tc.want)
			}
		})
	}
}
