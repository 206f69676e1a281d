package publish

import (
	ferryv1alpha1 "github.com/ferry-dev/ferry/api/v1alpha1"
	"github.com/ferry-dev/ferry/pkg/naming"
)

// namingCollisionRefusal returns why naming rules are refused when they can
// map objects of two workspaces onto one local object and the
// PublishedResource did not opt in (spec.naming.allowNameCollisions); ""
// when they are accepted.
func namingCollisionRefusal(n *ferryv1alpha1.ResourceNaming, rules *naming.Rules, namespaced bool) string {
	allowExisting := n != nil && n.AllowExistingNamespaces
	if rules.SeparatesWorkspaces(namespaced, allowExisting) || n != nil && n.AllowNameCollisions {
		return ""
	}
	return "spec.naming can map objects of different workspaces onto one local object (no rule contains " +
		naming.PlaceholderClusterName + ", and the namespace is not one the edge creates per workspace); " +
		"add " + naming.PlaceholderClusterName + " to spec.naming.name or spec.naming.namespace, or set " +
		"spec.naming.allowNameCollisions: true to accept that every object after the first that maps onto a taken name is refused with a CONFLICT"
}
