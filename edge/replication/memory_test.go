package replication

import (
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	ferryv1 "github.com/ferry-dev/ferry/api/gen/ferry/v1alpha1"
	"github.com/ferry-dev/ferry/edge/objectlog"
)

// memoryObjects is how many objects the memory figures are measured over.
const memoryObjects = 5000

// intentOfSize is an applied upsert of object i whose content is about
// size bytes of JSON, as the broker sends it.
func intentOfSize(i, size int) *ferryv1.SyncIntent {
	name := fmt.Sprintf("object-%05d", i)
	spec := strings.Repeat("x", max(size-200, 0))
	obj := fmt.Sprintf(`{"apiVersion":"kcp.example/v1","kind":"Thing","metadata":{"name":%q,"namespace":"team","labels":{"app":"demo"}},"spec":{"data":%q}}`, name, spec)
	return &ferryv1.SyncIntent{
		Key: &ferryv1.ObjectKey{Cluster: "2x8ajk3lmp0q9rst", Resource: &ferryv1.GroupVersionResource{Group: "kcp.example", Version: "v1", Resource: "things"},
			Namespace: "team", Name: name, Uid: fmt.Sprintf("9f6c1a2e-0000-4000-8000-%012d", i)},
		PublishedResource: "pr",
		Version:           &ferryv1.ObjectVersion{Sequence: uint64(i), ResourceVersion: fmt.Sprint(1000 + i)},
		Operation: &ferryv1.SyncIntent_Upsert{Upsert: &ferryv1.UpsertIntent{ContentHash: fmt.Sprintf("%064x", i),
			WorkspacePath: "root:org:team", Object: []byte(obj)}},
	}
}

// heapRetained returns the bytes of heap build's result keeps alive.
func heapRetained(build func() any) uint64 {
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	kept := build()
	runtime.GC()
	runtime.ReadMemStats(&after)
	runtime.KeepAlive(kept)
	if after.HeapAlloc < before.HeapAlloc {
		return 0
	}
	return after.HeapAlloc - before.HeapAlloc
}

// retainedPerObject measures the edge's bookkeeping per applied copy of
// objects of about size bytes: before the ledger (every applied intent
// kept whole, by the drift repair's record and the admin view's last
// handled intent) and with it (the ledger's record and the admin view's
// key, version and hash).
func retainedPerObject(size int) (before, after uint64) {
	type appliedCopyBefore struct {
		intent          *ferryv1.SyncIntent
		namespace, name string
		generation      int64
	}
	type handledBefore struct {
		in  *ferryv1.SyncIntent
		res *ferryv1.IntentResult
		at  time.Time
	}
	before = heapRetained(func() any {
		applied := map[string]appliedCopyBefore{}
		handled := map[string]handledBefore{}
		for i := range memoryObjects {
			in := intentOfSize(i, size)
			res := &ferryv1.IntentResult{Key: in.GetKey(), Version: in.GetVersion(), LocalNamespace: "local-ns", LocalName: in.GetKey().GetName()}
			applied[keyFor("pr", in.GetKey()).String()] = appliedCopyBefore{intent: in, namespace: "local-ns", name: in.GetKey().GetName(), generation: 1}
			handled[keyFor("pr", in.GetKey()).String()] = handledBefore{in: in, res: res, at: time.Now()}
		}
		return []any{applied, handled}
	}) / memoryObjects
	after = heapRetained(func() any {
		l := newLedger()
		handled := objectlog.New(nil)
		for i := range memoryObjects {
			in := intentOfSize(i, size)
			res := &ferryv1.IntentResult{Key: in.GetKey(), Version: in.GetVersion(), LocalNamespace: "local-ns", LocalName: in.GetKey().GetName()}
			l.applied(keyFor("pr", in.GetKey()), in.GetUpsert().GetContentHash(), "", "local-ns", in.GetKey().GetName(), 1)
			handled.IntentDone(in, res)
		}
		return []any{l, handled}
	}) / memoryObjects
	return before, after
}

// TestLedgerMemoryPerObject: the edge's memory per tracked copy no longer
// grows with the object's size (it kept every applied intent whole). Run
// with -v for the figures.
func TestLedgerMemoryPerObject(t *testing.T) {
	small, large := 1<<10, 16<<10
	beforeSmall, afterSmall := retainedPerObject(small)
	beforeLarge, afterLarge := retainedPerObject(large)
	for _, f := range []struct {
		size          int
		before, after uint64
	}{{small, beforeSmall, afterSmall}, {large, beforeLarge, afterLarge}} {
		t.Logf("objects of ~%d bytes: %d bytes retained per tracked copy before the ledger, %d with it (%.1fx less)",
			f.size, f.before, f.after, float64(f.before)/float64(max(f.after, 1)))
		if f.after >= f.before {
			t.Errorf("objects of ~%d bytes: %d bytes per copy with the ledger, not less than %d before", f.size, f.after, f.before)
		}
	}
	// 15 KiB more per object cost the old bookkeeping 15 KiB per copy; the
	// ledger keeps none of it.
	if grew := int64(afterLarge) - int64(afterSmall); grew > 256 {
		t.Errorf("the ledger's memory per copy grew by %d bytes with the object's size", grew)
	}
}
