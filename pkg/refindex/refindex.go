// Package refindex tracks where references point, so that a change of an
// object finds every reference pointing at it without scanning them all.
// Both sides use it for related objects: many primaries may name one
// Secret, and each primary names one object per related[] entry.
package refindex

// Index maps each reference R to the key of the object it points at, and
// back. Not safe for concurrent use: callers hold their own lock.
type Index[R comparable] struct {
	at   map[R]string
	refs map[string]map[R]struct{}
}

// New returns an empty index.
func New[R comparable]() *Index[R] {
	return &Index[R]{at: map[R]string{}, refs: map[string]map[R]struct{}{}}
}

// Point records that r now points at key; "" means nowhere (r is dropped).
func (x *Index[R]) Point(r R, key string) {
	old, had := x.at[r]
	if had && old == key {
		return
	}
	if had {
		delete(x.refs[old], r)
		if len(x.refs[old]) == 0 {
			delete(x.refs, old)
		}
		delete(x.at, r)
	}
	if key == "" {
		return
	}
	x.at[r] = key
	if x.refs[key] == nil {
		x.refs[key] = map[R]struct{}{}
	}
	x.refs[key][r] = struct{}{}
}

// To calls fn for every reference pointing at key.
func (x *Index[R]) To(key string, fn func(R)) {
	for r := range x.refs[key] {
		fn(r)
	}
}

// All calls fn for every reference that points somewhere.
func (x *Index[R]) All(fn func(R)) {
	for r := range x.at {
		fn(r)
	}
}

// Len is the number of references that point somewhere.
func (x *Index[R]) Len() int { return len(x.at) }

// At is the key r points at ("" when nowhere).
func (x *Index[R]) At(r R) string { return x.at[r] }

// Count is the number of references pointing at key.
func (x *Index[R]) Count(key string) int { return len(x.refs[key]) }
