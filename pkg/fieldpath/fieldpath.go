// Package fieldpath reads and writes values in JSON-like objects
// (map[string]any) by dot-separated paths such as "spec.secretName" or
// "spec.ports.0.name" (a numeric segment indexes a list). PublishedResources
// use such paths for related objects and mutations.
package fieldpath

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// ErrNotFound is returned when a path matches nothing.
var ErrNotFound = errors.New("path matches nothing")

// Path is a parsed field path.
type Path []string

// Parse splits and checks a path.
func Parse(s string) (Path, error) {
	if s == "" {
		return nil, errors.New("empty path")
	}
	p := Path(strings.Split(strings.TrimPrefix(s, "."), "."))
	for _, seg := range p {
		if seg == "" {
			return nil, fmt.Errorf("path %q has an empty segment", s)
		}
	}
	return p, nil
}

func (p Path) String() string { return strings.Join(p, ".") }

// Get returns the value at p.
func (p Path) Get(obj map[string]any) (any, error) {
	var cur any = obj
	for i, seg := range p {
		next, ok := step(cur, seg)
		if !ok {
			return nil, fmt.Errorf("%s: %w (at %q)", p, ErrNotFound, strings.Join(p[:i+1], "."))
		}
		cur = next
	}
	return cur, nil
}

// GetString returns the value at p, which must be a string (numbers and
// booleans are formatted).
func (p Path) GetString(obj map[string]any) (string, error) {
	v, err := p.Get(obj)
	if err != nil {
		return "", err
	}
	switch t := v.(type) {
	case string:
		return t, nil
	case int64, float64, bool:
		return fmt.Sprint(t), nil
	default:
		return "", fmt.Errorf("%s holds %T, not a string", p, v)
	}
}

// Set writes value at p, creating missing maps on the way (not lists).
func (p Path) Set(obj map[string]any, value any) error {
	parent, last, err := p.parent(obj, true)
	if err != nil {
		return err
	}
	switch c := parent.(type) {
	case map[string]any:
		c[last] = value
	case []any:
		i, err := index(last, len(c))
		if err != nil {
			return fmt.Errorf("%s: %w", p, err)
		}
		c[i] = value
	default:
		return fmt.Errorf("%s: cannot set a field of %T", p, parent)
	}
	return nil
}

// Delete removes the value at p; a missing value is not an error.
func (p Path) Delete(obj map[string]any) error {
	parent, last, err := p.parent(obj, false)
	if errors.Is(err, ErrNotFound) {
		return nil
	}
	if err != nil {
		return err
	}
	switch c := parent.(type) {
	case map[string]any:
		delete(c, last)
		return nil
	case []any:
		return fmt.Errorf("%s: deleting list items is not supported", p)
	default:
		return nil
	}
}

func (p Path) parent(obj map[string]any, create bool) (any, string, error) {
	var cur any = obj
	for i, seg := range p[:len(p)-1] {
		next, ok := step(cur, seg)
		if !ok {
			m, isMap := cur.(map[string]any)
			if !create || !isMap {
				return nil, "", fmt.Errorf("%s: %w (at %q)", p, ErrNotFound, strings.Join(p[:i+1], "."))
			}
			child := map[string]any{}
			m[seg] = child
			next = child
		}
		cur = next
	}
	return cur, p[len(p)-1], nil
}

func step(cur any, seg string) (any, bool) {
	switch c := cur.(type) {
	case map[string]any:
		v, ok := c[seg]
		return v, ok
	case []any:
		i, err := index(seg, len(c))
		if err != nil {
			return nil, false
		}
		return c[i], true
	default:
		return nil, false
	}
}

func index(seg string, n int) (int, error) {
	i, err := strconv.Atoi(seg)
	if err != nil || i < 0 || i >= n {
		return 0, fmt.Errorf("%q is not an index of a list of %d", seg, n)
	}
	return i, nil
}
