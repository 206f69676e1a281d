package replication

import (
	"strings"

	"github.com/kcp-dev/logicalcluster/v3"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
)

// objectName is where an object is in kcp: its logical cluster, namespace
// and name (no resource, no UID). The informer stores key objects by it:
// objects listed through a virtual workspace's /clusters/* share
// namespaces and names across workspaces, so client-go's namespace/name
// keys would collide.
type objectName struct{ cluster, namespace, name string }

// nameOf is obj's place (its cluster from the kcp.io/cluster annotation,
// which objects listed through /clusters/* carry).
func nameOf(obj metav1.Object) objectName {
	return objectName{cluster: logicalcluster.From(obj).String(), namespace: obj.GetNamespace(), name: obj.GetName()}
}

// nameOfKey is the place of the object behind a protocol key.
func nameOfKey(key *ferryv1.ObjectKey) objectName {
	return objectName{cluster: key.GetCluster(), namespace: key.GetNamespace(), name: key.GetName()}
}

// storeKey is n's key in the informer stores, "cluster|namespace/name":
// the one place that writes the format (parseStoreKey reads it).
func (n objectName) storeKey() string {
	return n.cluster + "|" + n.namespace + "/" + n.name
}

// parseStoreKey is the place behind an informer store key (storeKey).
func parseStoreKey(k string) objectName {
	cluster, rest, _ := strings.Cut(k, "|")
	namespace, name, ok := strings.Cut(rest, "/")
	if !ok {
		namespace, name = "", rest
	}
	return objectName{cluster: cluster, namespace: namespace, name: name}
}

// namespaceName is the place of a workspace's namespace (a cluster-scoped
// object): what the namespaces watch keys it by.
func namespaceName(cluster, namespace string) objectName {
	return objectName{cluster: cluster, name: namespace}
}

// inNamespaceKeyPrefix is the prefix of the store keys of every object in
// namespace ns (a namespaceName).
func inNamespaceKeyPrefix(ns objectName) string {
	return objectName{cluster: ns.cluster, namespace: ns.name}.storeKey()
}
