package replication

import (
	"fmt"
	"strings"
	"testing"

	"google.golang.org/protobuf/proto"
	"k8s.io/apimachinery/pkg/runtime"

	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
	"github.com/ferry-dev/ferry/pkg/naming"
)

// limitedSink is a stream whose broker accepts messages up to limit bytes.
type limitedSink struct {
	recordingSink
	limit int
}

func (s *limitedSink) MaxMessageBytes() int { return s.limit }

// longNamedCopies returns n local copies whose names (local and remote) are
// as long as Kubernetes allows.
func longNamedCopies(n int) []any {
	var out []any
	for i := range n {
		_, remote := remoteThing()
		remote.Namespace = strings.Repeat("t", 60) + fmt.Sprintf("%03d", i%1000)
		remote.Name = strings.Repeat("n", 240) + fmt.Sprintf("%05d", i)
		remote.UID = fmt.Sprintf("00000000-0000-0000-0000-%012d", i)
		cp := localCopy(remote)
		cp.SetName(strings.Repeat("l", 240) + fmt.Sprintf("%05d", i))
		ann := cp.GetAnnotations()
		ann[naming.AnnotationContentHash] = strings.Repeat("h", 64)
		ann[naming.AnnotationResourceVersion] = "123456789"
		cp.SetAnnotations(ann)
		out = append(out, cp)
	}
	return out
}

// TestInventoryChunksFitTheBrokersLimit: a resource with many long-named
// copies is inventoried in messages the broker accepts (the size it
// announced), none lost, the last one complete.
func TestInventoryChunksFitTheBrokersLimit(t *testing.T) {
	const copies, limit = 600, 64 << 10
	var objs []runtime.Object
	for _, cp := range longNamedCopies(copies) {
		objs = append(objs, cp.(runtime.Object))
	}
	e, _, _ := testEngine(t, true, objs...)
	e.Attach(&limitedSink{limit: limit})
	var msgs []*ferryv1.ConnectRequest
	for {
		m, ok := e.Next()
		if !ok {
			break
		}
		if m.GetInventory() != nil {
			msgs = append(msgs, m)
		}
	}
	entries := 0
	for i, m := range msgs {
		if size := proto.Size(m); size > limit {
			t.Errorf("chunk %d of %d is %d bytes, over the broker's %d", i, len(msgs), size, limit)
		}
		if complete := m.GetInventory().GetComplete(); complete != (i == len(msgs)-1) {
			t.Errorf("chunk %d of %d complete=%v", i, len(msgs), complete)
		}
		entries += len(m.GetInventory().GetEntries())
	}
	if entries != copies {
		t.Errorf("%d entries inventoried, want %d", entries, copies)
	}
}

func TestInventoryMessages(t *testing.T) {
	entry := func(i int) *ferryv1.InventoryEntry {
		return &ferryv1.InventoryEntry{Key: &ferryv1.ObjectKey{Cluster: "c1", Name: strings.Repeat("n", 200) + fmt.Sprint(i)},
			PublishedResource: "pr", LocalNamespace: "ns", LocalName: strings.Repeat("l", 200)}
	}
	entries := func(n int) []*ferryv1.InventoryEntry {
		var out []*ferryv1.InventoryEntry
		for i := range n {
			out = append(out, entry(i))
		}
		return out
	}
	one := proto.Size(&ferryv1.ConnectRequest{Message: &ferryv1.ConnectRequest_Inventory{Inventory: &ferryv1.Inventory{
		PublishedResource: "pr", Entries: entries(1), Complete: true}}})
	for _, tc := range []struct {
		name      string
		entries   int
		limit     int
		wantMsgs  int
		overLimit bool // entries larger than the limit on their own
	}{
		{name: "none: one empty complete message", entries: 0, limit: 1000, wantMsgs: 1},
		{name: "all fit", entries: 10, limit: 1 << 20, wantMsgs: 1},
		{name: "exactly one per message", entries: 5, limit: one + 8, wantMsgs: 5},
		{name: "an entry over the limit goes alone", entries: 3, limit: 100, wantMsgs: 3, overLimit: true},
		{name: "cut by bytes", entries: 100, limit: 10 * one, wantMsgs: 10},
	} {
		t.Run(tc.name, func(t *testing.T) {
			msgs := inventoryMessages(&ferryv1.Inventory{PublishedResource: "pr", Entries: entries(tc.entries)}, tc.limit)
			if len(msgs) != tc.wantMsgs {
				t.Errorf("%d messages, want %d", len(msgs), tc.wantMsgs)
			}
			n := 0
			for i, m := range msgs {
				inv := m.GetInventory()
				if inv.GetPublishedResource() != "pr" || inv.GetComplete() != (i == len(msgs)-1) {
					t.Errorf("message %d: %v complete=%v", i, inv.GetPublishedResource(), inv.GetComplete())
				}
				if tc.entries > 0 && len(inv.GetEntries()) == 0 {
					t.Errorf("message %d holds no entry", i)
				}
				if size := proto.Size(m); size > tc.limit && (!tc.overLimit || len(inv.GetEntries()) > 1) {
					t.Errorf("message %d is %d bytes, over %d", i, size, tc.limit)
				}
				if i < len(msgs)-1 && !tc.overLimit {
					// Full: the next message's first entry would not have fit.
					more := proto.Clone(m).(*ferryv1.ConnectRequest)
					more.GetInventory().Entries = append(more.GetInventory().Entries, msgs[i+1].GetInventory().GetEntries()[0])
					if size := proto.Size(more); size <= tc.limit {
						t.Errorf("message %d cut early: %d bytes with the next entry, limit %d", i, size, tc.limit)
					}
				}
				for _, e := range inv.GetEntries() {
					if want := entry(n).GetKey().GetName(); e.GetKey().GetName() != want {
						t.Fatalf("entry %d out of order", n)
					}
					n++
				}
			}
			if n != tc.entries {
				t.Errorf("%d entries, want %d", n, tc.entries)
			}
		})
	}
}

// TestInventoryMessagesCarryRelatedEntries: related entries are cut into
// messages the broker accepts like the others, after them, none lost, and
// related_complete rides on the complete message only.
func TestInventoryMessagesCarryRelatedEntries(t *testing.T) {
	const n, limit = 50, 4 << 10
	all := &ferryv1.Inventory{PublishedResource: "pr", RelatedComplete: true}
	for i := range n {
		all.Entries = append(all.Entries, &ferryv1.InventoryEntry{Key: &ferryv1.ObjectKey{Cluster: "c1", Name: strings.Repeat("n", 100) + fmt.Sprint(i)}})
		all.RelatedEntries = append(all.RelatedEntries, &ferryv1.RelatedInventoryEntry{
			RelatedTo: &ferryv1.RelatedTo{Primary: &ferryv1.ObjectKey{Cluster: "c1", Name: strings.Repeat("n", 100) + fmt.Sprint(i)}, Identifier: "creds"},
			Key:       &ferryv1.ObjectKey{Cluster: "c1", Name: "creds"}, AppliedHash: strings.Repeat("h", 32)})
	}
	msgs := inventoryMessages(all, limit)
	if len(msgs) < 2 {
		t.Fatalf("%d messages, want the inventory cut", len(msgs))
	}
	entries, related := 0, 0
	for i, m := range msgs {
		inv := m.GetInventory()
		if size := proto.Size(m); size > limit {
			t.Errorf("message %d is %d bytes, over %d", i, size, limit)
		}
		last := i == len(msgs)-1
		if inv.GetComplete() != last || inv.GetRelatedComplete() != last || inv.GetPublishedResource() != "pr" {
			t.Errorf("message %d: complete=%v related_complete=%v resource %q", i, inv.GetComplete(), inv.GetRelatedComplete(), inv.GetPublishedResource())
		}
		for _, e := range inv.GetRelatedEntries() {
			if !strings.HasSuffix(e.GetRelatedTo().GetPrimary().GetName(), fmt.Sprint(related)) {
				t.Fatalf("related entry %d out of order", related)
			}
			related++
		}
		entries += len(inv.GetEntries())
	}
	if entries != n || related != n {
		t.Errorf("%d entries and %d related entries, want %d each", entries, related, n)
	}
}
