package publish

import (
	"strings"
	"testing"

	ferryv1alpha1 "github.com/ferry-dev/ferry/api/v1alpha1"
	"github.com/ferry-dev/ferry/pkg/naming"
)

// TestNamingThatMapsWorkspacesTogetherIsRefused: "$remoteNamespace" with
// allowExistingNamespaces (which the API docs suggest) maps two workspaces'
// default/app onto one local object; it is refused unless the
// PublishedResource opts in.
func TestNamingThatMapsWorkspacesTogetherIsRefused(t *testing.T) {
	for _, tc := range []struct {
		name    string
		naming  *ferryv1alpha1.ResourceNaming
		refused bool
	}{
		{name: "defaults"},
		{name: "remote namespace onto existing namespaces", refused: true,
			naming: &ferryv1alpha1.ResourceNaming{Namespace: naming.PlaceholderNamespace, Name: naming.PlaceholderName, AllowExistingNamespaces: true}},
		{name: "the same, opted in",
			naming: &ferryv1alpha1.ResourceNaming{Namespace: naming.PlaceholderNamespace, Name: naming.PlaceholderName, AllowExistingNamespaces: true, AllowNameCollisions: true}},
		{name: "workspace in the name",
			naming: &ferryv1alpha1.ResourceNaming{Namespace: naming.PlaceholderNamespace, Name: "$remoteClusterName-$remoteName", AllowExistingNamespaces: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rules, err := naming.Compile(tc.naming)
			if err != nil {
				t.Fatal(err)
			}
			msg := namingCollisionRefusal(tc.naming, rules, true)
			if tc.refused != (msg != "") {
				t.Fatalf("refusal %q, want refused=%v", msg, tc.refused)
			}
			if tc.refused && !strings.Contains(msg, "allowNameCollisions") {
				t.Fatalf("the refusal does not say how to opt in: %q", msg)
			}
		})
	}
}
