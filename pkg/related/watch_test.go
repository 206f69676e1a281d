package related

import (
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	ferryv1alpha1 "github.com/ferry-dev/ferry/api/v1alpha1"
)

// TestWatchSelector: watch.labelSelector compiles to the selector the
// edge's informers list with (in the API server's syntax, the same for
// the same labels however written) and that every lookup checks; it is
// refused for origin kcp and when it would select everything.
func TestWatchSelector(t *testing.T) {
	byLabels := func(m map[string]string) *ferryv1alpha1.RelatedResourceWatch {
		return &ferryv1alpha1.RelatedResourceWatch{LabelSelector: metav1.LabelSelector{MatchLabels: m}}
	}
	for _, tc := range []struct {
		name      string
		origin    ferryv1alpha1.RelatedResourceOrigin
		watch     *ferryv1alpha1.RelatedResourceWatch
		want      string // WatchSelector
		matches   map[string]string
		unmatched map[string]string
		wantErr   string
	}{
		{name: "no watch: every object", origin: ferryv1alpha1.OriginService, want: "",
			matches: map[string]string{}},
		{name: "matchLabels, sorted", origin: ferryv1alpha1.OriginService,
			watch:     byLabels(map[string]string{"tier": "db", "app.kubernetes.io/managed-by": "db-operator"}),
			want:      "app.kubernetes.io/managed-by=db-operator,tier=db",
			matches:   map[string]string{"app.kubernetes.io/managed-by": "db-operator", "tier": "db", "more": "x"},
			unmatched: map[string]string{"tier": "db"}},
		{name: "matchExpressions", origin: ferryv1alpha1.OriginService,
			watch: &ferryv1alpha1.RelatedResourceWatch{LabelSelector: metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{
				{Key: "tier", Operator: metav1.LabelSelectorOpIn, Values: []string{"web", "db"}}, {Key: "db", Operator: metav1.LabelSelectorOpExists},
			}}},
			want: "db,tier in (db,web)", matches: map[string]string{"db": "", "tier": "web"}, unmatched: map[string]string{"tier": "web"}},
		{name: "origin kcp", origin: ferryv1alpha1.OriginKCP, watch: byLabels(map[string]string{"app": "db"}),
			wantErr: "watch: it narrows what the edge caches of a service-origin related kind"},
		{name: "origin platform (kcp)", origin: ferryv1alpha1.OriginPlatform, watch: byLabels(map[string]string{"app": "db"}),
			wantErr: "for origin kcp the broker watches the objects in kcp"},
		{name: "selects everything", origin: ferryv1alpha1.OriginService, watch: byLabels(nil),
			wantErr: "watch.labelSelector: it selects every object"},
		{name: "bad operator", origin: ferryv1alpha1.OriginService,
			watch: &ferryv1alpha1.RelatedResourceWatch{LabelSelector: metav1.LabelSelector{MatchExpressions: []metav1.LabelSelectorRequirement{
				{Key: "tier", Operator: "Like", Values: []string{"db"}},
			}}},
			wantErr: `watch.labelSelector: "Like" is not a valid label selector operator`},
		{name: "bad label value", origin: ferryv1alpha1.OriginService, watch: byLabels(map[string]string{"app": "not ok"}),
			wantErr: "watch.labelSelector: "},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := spec(ferryv1alpha1.ResourceLocator{Path: "spec.secretName"}, nil)
			s.Origin, s.Watch = tc.origin, tc.watch
			refs, err := Compile([]ferryv1alpha1.RelatedResourceSpec{s})
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want one containing %q", err, tc.wantErr)
				}
				if !strings.HasPrefix(err.Error(), "spec.related[creds]: ") {
					t.Errorf("error %q does not name the entry", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got := refs[0].WatchSelector(); got != tc.want {
				t.Errorf("WatchSelector %q, want %q", got, tc.want)
			}
			if tc.matches != nil && !refs[0].Watches(tc.matches) {
				t.Errorf("labels %v are not watched", tc.matches)
			}
			if tc.unmatched != nil && refs[0].Watches(tc.unmatched) {
				t.Errorf("labels %v are watched", tc.unmatched)
			}
		})
	}
}
