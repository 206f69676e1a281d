package outbox

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
)

// step is one operation on an outbox and what it must return.
type step struct {
	op   string // put, next, ack, ackseq, reset, drop, forget
	key  string
	val  string
	seq  uint64 // for ack/ackseq; 0 = the seq the last put of key returned
	want string // next: "key=val" or "" for none; ack: "ok" or "stale"
}

func TestOutbox(t *testing.T) {
	cases := []struct {
		name   string
		window int
		steps  []step
	}{
		{"latest wins and keeps its place", 10, []step{
			{op: "put", key: "a", val: "1"}, {op: "put", key: "b", val: "1"}, {op: "put", key: "a", val: "2"},
			{op: "next", want: "a=2"}, {op: "next", want: "b=1"}, {op: "next", want: ""},
		}},
		{"window bounds in-flight messages", 2, []step{
			{op: "put", key: "a", val: "1"}, {op: "put", key: "b", val: "1"}, {op: "put", key: "c", val: "1"},
			{op: "next", want: "a=1"}, {op: "next", want: "b=1"}, {op: "next", want: ""},
			{op: "ack", key: "a", want: "ok"}, {op: "next", want: "c=1"},
		}},
		{"a delete waits for the in-flight upsert of its key", 10, []step{
			{op: "put", key: "a", val: "upsert"}, {op: "next", want: "a=upsert"},
			{op: "put", key: "a", val: "delete"}, {op: "put", key: "b", val: "1"},
			{op: "next", want: "b=1"}, {op: "next", want: ""},
			{op: "ack", key: "a", seq: 1, want: "ok"}, {op: "next", want: "a=delete"},
		}},
		{"stale and unknown answers are ignored", 10, []step{
			{op: "put", key: "a", val: "1"}, {op: "next", want: "a=1"},
			{op: "ack", key: "a", seq: 99, want: "stale"}, {op: "ack", key: "x", seq: 1, want: "stale"},
			{op: "ack", key: "a", seq: 1, want: "ok"}, {op: "ack", key: "a", seq: 1, want: "stale"},
		}},
		{"answers by sequence only", 10, []step{
			{op: "put", key: "a", val: "1"}, {op: "put", key: "b", val: "1"}, {op: "next", want: "a=1"}, {op: "next", want: "b=1"},
			{op: "ackseq", seq: 2, want: "ok"}, {op: "ackseq", seq: 2, want: "stale"}, {op: "ackseq", seq: 1, want: "ok"},
		}},
		{"reset re-sends unanswered messages first, in send order", 10, []step{
			{op: "put", key: "a", val: "1"}, {op: "put", key: "b", val: "1"}, {op: "put", key: "c", val: "1"},
			{op: "next", want: "a=1"}, {op: "next", want: "b=1"},
			{op: "reset"},
			{op: "next", want: "a=1"}, {op: "next", want: "b=1"}, {op: "next", want: "c=1"},
		}},
		{"reset keeps a held newer message instead of the old one", 10, []step{
			{op: "put", key: "a", val: "1"}, {op: "next", want: "a=1"}, {op: "put", key: "a", val: "2"},
			{op: "reset"},
			{op: "next", want: "a=2"}, {op: "next", want: ""},
			{op: "ack", key: "a", seq: 1, want: "stale"},
		}},
		{"drop removes only the pending message", 10, []step{
			{op: "put", key: "a", val: "1"}, {op: "next", want: "a=1"}, {op: "put", key: "a", val: "2"}, {op: "put", key: "b", val: "1"},
			{op: "drop", key: "a"}, {op: "drop", key: "b"},
			{op: "ack", key: "a", seq: 1, want: "ok"}, {op: "next", want: ""},
		}},
		{"forget removes pending and in-flight", 1, []step{
			{op: "put", key: "a", val: "1"}, {op: "next", want: "a=1"}, {op: "put", key: "b", val: "1"},
			{op: "forget", key: "a"}, {op: "next", want: "b=1"}, {op: "ack", key: "a", seq: 1, want: "stale"},
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			o := New[string, string](tc.window, nil)
			seqs := map[string]uint64{}
			for i, s := range tc.steps {
				switch s.op {
				case "put":
					seqs[s.key] = o.Put(s.key, s.val)
				case "next":
					got := ""
					if e, ok := o.Next(); ok {
						got = e.Key + "=" + e.Value
					}
					if got != s.want {
						t.Fatalf("step %d: next = %q, want %q", i, got, s.want)
					}
				case "ack", "ackseq":
					seq := s.seq
					if seq == 0 {
						seq = seqs[s.key]
					}
					var ok bool
					if s.op == "ack" {
						_, ok = o.Ack(s.key, seq)
					} else {
						_, ok = o.AckSeq(seq)
					}
					if got := map[bool]string{true: "ok", false: "stale"}[ok]; got != s.want {
						t.Fatalf("step %d: %s(%s, %d) = %s, want %s", i, s.op, s.key, seq, got, s.want)
					}
				case "reset":
					o.Reset()
				case "drop":
					o.Drop(s.key)
				case "forget":
					o.Forget(s.key)
				default:
					t.Fatalf("unknown op %q", s.op)
				}
			}
		})
	}
}

// TestOutboxConcurrent puts, sends, answers and resets from several
// goroutines and checks that the last value of every key is delivered and
// that memory holds one entry per key at most.
func TestOutboxConcurrent(t *testing.T) {
	const keys, puts = 200, 20000
	o := New[int, int](16, nil)
	var wg sync.WaitGroup
	for w := range 4 {
		wg.Go(func() {
			r := rand.New(rand.NewPCG(uint64(w), 1))
			for i := range puts / 4 {
				o.Put(r.IntN(keys), i)
			}
		})
	}
	wg.Go(func() {
		for range 50 {
			o.Reset()
		}
	})
	wg.Wait()
	// Put the final value of every key, then drain.
	for k := range keys {
		o.Put(k, -1)
	}
	last := map[int]int{}
	for rounds := 0; ; rounds++ {
		if rounds > puts+keys*4 {
			t.Fatal("outbox does not drain")
		}
		e, ok := o.Next()
		if !ok {
			if s := o.Stats(); s.InFlight == 0 && s.Pending == 0 {
				break
			}
			o.Reset() // answers of the old stream are lost
			continue
		}
		last[e.Key] = e.Value
		if _, ok := o.Ack(e.Key, e.Seq); !ok {
			t.Fatalf("ack of %d seq %d refused", e.Key, e.Seq)
		}
	}
	for k := range keys {
		if last[k] != -1 {
			t.Fatalf("key %d: last delivered %d, want -1", k, last[k])
		}
	}
}

func BenchmarkOutboxCycle(b *testing.B) {
	o := New[string, int](256, nil)
	keys := make([]string, 1000)
	for i := range keys {
		keys[i] = fmt.Sprint("key-", i)
	}
	b.ReportAllocs()
	for i := 0; b.Loop(); i++ {
		o.Put(keys[i%len(keys)], i)
		if e, ok := o.Next(); ok {
			o.Ack(e.Key, e.Seq)
		}
	}
}
