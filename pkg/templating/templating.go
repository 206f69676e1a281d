// Package templating is the one Go-template engine of a PublishedResource:
// naming rules, template mutations and related-object templates all parse
// and execute through it, over one data model (Data) that answers to the
// names ferry uses and to those of its ancestors (the seeds' servlet and
// api-syncagent), so a template written for any of them works as written.
//
// Functions: sprig v3 (without env and expandenv: a template must not read
// the edge's environment) plus sha3sum, sha3short, shortHash and ferry's
// hash. Output is whitespace-trimmed.
package templating

import (
	"bytes"
	"crypto/sha1" //nolint:gosec // shortHash is fixed by the ancestors' naming, not a security measure
	"crypto/sha3"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"text/template"

	"github.com/Masterminds/sprig/v3"
)

// HashLength is how many hex characters shortHash, hash and the default
// sha3short keep.
const HashLength = 20

// Template is a parsed template. Safe for concurrent use.
type Template struct {
	tmpl *template.Template
}

// Parse parses text; name appears in errors (e.g. "spec.naming.name").
// A missing map key is an error when executed, not "<no value>": a name or
// value silently built from nothing would be worse than a refusal.
func Parse(name, text string) (*Template, error) {
	t, err := template.New(name).Option("missingkey=error").Funcs(funcs()).Parse(text)
	if err != nil {
		return nil, fmt.Errorf("%s is not a valid template: %w", name, err)
	}
	return &Template{tmpl: t}, nil
}

// Name is the name given to Parse.
func (t *Template) Name() string { return t.tmpl.Name() }

// Execute runs the template on data; the output is whitespace-trimmed.
func (t *Template) Execute(data Data) (string, error) {
	var buf bytes.Buffer
	if err := t.tmpl.Execute(&buf, &data); err != nil {
		return "", err
	}
	return strings.TrimSpace(buf.String()), nil
}

// Check executes the template on sample data (SampleData) to find what
// would fail on every object: data the model does not have (".Obj"), a
// field a typed view lacks (".LocalObject.ObjectMeta.Nam"). A value that
// the sample object merely lacks (".Object.spec.secretName") is not an
// error: real objects may have it.
func (t *Template) Check(sample Data) error {
	_, err := t.Execute(sample)
	if err == nil || !fatal(err) {
		return nil
	}
	return fmt.Errorf("%s: %w", t.Name(), err)
}

// fatal tells whether an execution error on a sample would happen on any
// object: a field looked up in a Go type (Data, a typed metadata view)
// that it does not have. Lookups in an object's content (maps, whose
// content the sample does not predict) are never fatal.
func fatal(err error) bool {
	var ee template.ExecError
	if !errors.As(err, &ee) {
		return false
	}
	msg := ee.Error()
	i := strings.LastIndex(msg, "can't evaluate field ")
	if i < 0 {
		return false
	}
	typ := msg[strings.LastIndex(msg, " in type ")+len(" in type "):]
	// interface {} and maps are object content; anything else is a Go type
	// of the data model.
	return !strings.HasPrefix(typ, "interface") && !strings.HasPrefix(typ, "map[")
}

func funcs() template.FuncMap {
	f := sprig.TxtFuncMap()
	// A template must not read the process environment (credentials).
	delete(f, "env")
	delete(f, "expandenv")
	f["sha3sum"] = sha3sum
	f["sha3short"] = sha3short
	f["shortHash"] = shortHash
	// ferry's name for shortHash (naming templates before this package).
	f["hash"] = shortHash
	return f
}

// sha3sum is the hex-encoded SHA3-256 of s.
func sha3sum(s string) string {
	sum := sha3.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}

// sha3short is the first LENGTH (default 20) hex characters of sha3sum.
// Called as `sha3short S`, `sha3short S N` or, in a pipeline,
// `S | sha3short` and `S | sha3short N` (the piped value comes last).
func sha3short(args ...any) (string, error) {
	var s string
	length := HashLength
	switch len(args) {
	case 1:
		v, ok := args[0].(string)
		if !ok {
			return "", fmt.Errorf("sha3short: want a string, got %T", args[0])
		}
		s = v
	case 2:
		str, n := args[0], args[1]
		if _, ok := str.(string); !ok {
			str, n = n, str
		}
		v, ok := str.(string)
		if !ok {
			return "", fmt.Errorf("sha3short: want a string and a length, got %T and %T", args[0], args[1])
		}
		l, ok := toInt(n)
		if !ok || l < 1 {
			return "", fmt.Errorf("sha3short: the length %v is not a positive number", n)
		}
		s, length = v, l
	default:
		return "", fmt.Errorf("sha3short: want a string and an optional length, got %d arguments", len(args))
	}
	sum := sha3sum(s)
	return sum[:min(length, len(sum))], nil
}

func toInt(v any) (int, bool) {
	switch n := v.(type) {
	case int:
		return n, true
	case int64:
		return int(n), true
	case float64:
		return int(n), n == float64(int(n))
	}
	return 0, false
}

// shortHash is the first 20 hex characters of the SHA-1 of s: the hash of
// the seeds' $remoteNameHash placeholders.
func shortHash(s string) string {
	sum := sha1.Sum([]byte(s)) //nolint:gosec // see import
	return hex.EncodeToString(sum[:])[:HashLength]
}

// ShortHash is shortHash for Go callers (pkg/naming's placeholders).
func ShortHash(s string) string { return shortHash(s) }
