package refindex

import (
	"slices"
	"testing"
)

func collect(x *Index[string], key string) []string {
	var out []string
	x.To(key, func(r string) { out = append(out, r) })
	slices.Sort(out)
	return out
}

func TestIndex(t *testing.T) {
	x := New[string]()
	x.Point("a", "secret/1")
	x.Point("b", "secret/1")
	x.Point("c", "secret/2")
	if got := collect(x, "secret/1"); !slices.Equal(got, []string{"a", "b"}) {
		t.Fatalf("To(secret/1) = %v", got)
	}
	x.Point("a", "secret/2") // moved
	if got := collect(x, "secret/1"); !slices.Equal(got, []string{"b"}) {
		t.Errorf("after the move To(secret/1) = %v", got)
	}
	if got := collect(x, "secret/2"); !slices.Equal(got, []string{"a", "c"}) {
		t.Errorf("after the move To(secret/2) = %v", got)
	}
	x.Point("b", "")
	x.Point("b", "") // dropping twice is fine
	if got := collect(x, "secret/1"); got != nil || x.Len() != 2 || len(x.refs) != 1 {
		t.Errorf("after dropping b: To = %v, Len = %d, keys = %d", got, x.Len(), len(x.refs))
	}
	n := 0
	x.All(func(string) { n++ })
	if n != 2 {
		t.Errorf("All visited %d", n)
	}
}
