package replication

import (
	"strings"
	"testing"
)

// TestStoreKeys checks the one store key format both ways, and that the
// namespace prefix selects exactly the objects of that namespace.
func TestStoreKeys(t *testing.T) {
	for _, n := range []objectName{
		{cluster: "c", namespace: "ns", name: "a"},
		{cluster: "c", name: "cluster-scoped"},
		namespaceName("root:team", "ns"),
		{cluster: "c", namespace: "ns", name: "a.b-c"},
	} {
		if got := parseStoreKey(n.storeKey()); got != n {
			t.Errorf("parseStoreKey(%q) = %+v, want %+v", n.storeKey(), got, n)
		}
	}
	if got, want := storeKey(stepKey("u-a")), "c|ns/a"; got != want {
		t.Errorf("storeKey = %q, want %q", got, want)
	}
	prefix := inNamespaceKeyPrefix(parseStoreKey(namespaceName("c", "ns").storeKey()))
	for k, in := range map[string]bool{
		objectName{cluster: "c", namespace: "ns", name: "a"}.storeKey():   true,
		objectName{cluster: "c", namespace: "ns2", name: "a"}.storeKey():  false,
		objectName{cluster: "c2", namespace: "ns", name: "a"}.storeKey():  false,
		objectName{cluster: "cc", namespace: "ns", name: "a"}.storeKey():  false,
		objectName{cluster: "c", namespace: "", name: "ns"}.storeKey():    false,
		objectName{cluster: "c", namespace: "nsx", name: "ns"}.storeKey(): false,
	} {
		if strings.HasPrefix(k, prefix) != in {
			t.Errorf("%q in namespace c/ns: %v, want %v", k, !in, in)
		}
	}
}
