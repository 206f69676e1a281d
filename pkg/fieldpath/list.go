package fieldpath

import (
	"errors"
	"fmt"
	"strings"
)

// List paths. A related entry's reference may name several objects: in
// gjson's syntax (api-syncagent's) a "#" segment stands for every item of
// the list before it, so "spec.users.#.name" is the name field of each
// user and "spec.secretNames.#" each item of a list of strings (gjson
// counts the items there; a count is never an object's name, so ferry
// reads it as the items). A ListPath holds at most one "#": the values
// are one flat list, in the order of the items, and a list of lists has
// no such order.

// ListMarker is the segment that stands for every item of a list.
const ListMarker = "#"

// ListPath is a path with at most one ListMarker segment.
type ListPath struct {
	// Items is the path to the list (before the marker); nil for a path
	// without a marker.
	Items Path
	// Each is the path within each item (after the marker); the whole
	// path when there is no marker.
	Each Path
	list bool
}

// ParseList parses a path that may hold one "#" segment.
func ParseList(s string) (ListPath, error) {
	p, err := Parse(s)
	if err != nil {
		return ListPath{}, err
	}
	at := -1
	for i, seg := range p {
		if seg != ListMarker {
			continue
		}
		if at >= 0 {
			return ListPath{}, fmt.Errorf("path %q has more than one %q: the values must be one list in the order of its items; name a field of each item once, e.g. spec.users.#.name", s, ListMarker)
		}
		at = i
	}
	switch {
	case at < 0:
		return ListPath{Each: p}, nil
	case at == 0:
		return ListPath{}, fmt.Errorf("path %q starts with %q, but an object is not a list; write the path to the list first, e.g. spec.users.#.name", s, ListMarker)
	}
	return ListPath{Items: p[:at], Each: p[at+1:], list: true}, nil
}

// IsList tells whether the path holds a "#" (it yields a list).
func (l ListPath) IsList() bool { return l.list }

func (l ListPath) String() string {
	if !l.list {
		return l.Each.String()
	}
	return strings.Join(append(append(append([]string{}, l.Items...), ListMarker), l.Each...), ".")
}

// GetStrings returns the strings at l, one per item of the list in order
// (numbers and booleans are formatted). A missing list is an empty one;
// an item without the field, or one that holds no string, is an error
// naming its position: the values are matched by position with those of
// another object, so none may be skipped. A path without a marker yields
// its one value (GetString).
func (l ListPath) GetStrings(obj map[string]any) ([]string, error) {
	if !l.list {
		v, err := l.Each.GetString(obj)
		if err != nil {
			return nil, err
		}
		return []string{v}, nil
	}
	raw, err := l.Items.Get(obj)
	if errors.Is(err, ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	if raw == nil {
		return nil, nil
	}
	items, ok := raw.([]any)
	if !ok {
		return nil, fmt.Errorf("%s holds %T, not a list", l.Items, raw)
	}
	out := make([]string, 0, len(items))
	for i, item := range items {
		v, err := itemString(item, l.Each)
		if err != nil {
			return nil, fmt.Errorf("%s: item %d: %w", l, i, err)
		}
		out = append(out, v)
	}
	return out, nil
}

// itemString is the string at each within item (item itself when each is
// empty).
func itemString(item any, each Path) (string, error) {
	if len(each) == 0 {
		return scalarString(each, item)
	}
	m, ok := item.(map[string]any)
	if !ok {
		return "", fmt.Errorf("holds %T, not an object with %s", item, each)
	}
	return each.GetString(m)
}

func scalarString(p Path, v any) (string, error) {
	switch t := v.(type) {
	case string:
		return t, nil
	case int64, float64, bool:
		return fmt.Sprint(t), nil
	default:
		if len(p) == 0 {
			return "", fmt.Errorf("holds %T, not a string", v)
		}
		return "", fmt.Errorf("%s holds %T, not a string", p, v)
	}
}
