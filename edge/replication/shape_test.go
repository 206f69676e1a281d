package replication

import (
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	"github.com/ferry-dev/ferry/pkg/naming"
)

// TestShapeChangeReachesExistingCopies: a PublishedResource change that
// shapes the copies (a new spec mutation) re-applies existing copies,
// though the kcp content of their objects is unchanged: the inventory
// reports copies applied under another shape as not applied (the broker
// re-sends them through its window), and the re-sent intent is applied.
func TestShapeChangeReachesExistingCopies(t *testing.T) {
	key, remote := remoteThing()
	withShape := func(name, shape string) *unstructured.Unstructured {
		u := localCopy(remote)
		u.SetName(name)
		ann := u.GetAnnotations()
		ann[naming.AnnotationContentHash] = "h1"
		if shape != "" {
			ann[naming.AnnotationShape] = shape
		}
		u.SetAnnotations(ann)
		return u
	}
	shape := engineSetup{published: func(p *Published) { p.Shape = "s2" }}
	current, old := withShape("current", "s2"), withShape("old", "s1")
	e, _, _ := testEngineWith(t, shape, current, old)
	drainInventories(e) // the handshake's
	e.RequestInventory(nil)
	got := map[string]string{}
	for {
		m, ok := e.Next()
		if !ok {
			break
		}
		for _, en := range m.GetInventory().GetEntries() {
			got[en.GetLocalName()] = en.GetAppliedHash()
		}
	}
	if got["current"] != "h1" || got["old"] != "" {
		t.Fatalf("inventory applied hashes %v: want current=h1 and old unreported (applied under another shape)", got)
	}

	// The re-sent intent (same kcp content) is applied over the old shape.
	e2, _, _ := testEngineWith(t, shape, old)
	acceptApplies(e2)
	key.Name = old.GetAnnotations()[naming.AnnotationName]
	e2.Handle(upsertOf(key, 2, "h1", thingA))
	runQueue(t, e2)
	p := patches(t, e2)
	if len(p) != 1 || p[0].GetAnnotations()[naming.AnnotationShape] != "s2" {
		t.Fatalf("the copy was not applied again under the new shape (applies: %v)", p)
	}
}
