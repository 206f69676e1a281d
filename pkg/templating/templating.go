// Package templating is the one Go template dialect of PublishedResources:
// text/template with sprig v3's functions (without env and expandenv, so a
// template cannot read the edge's environment — credentials live there),
// plus the hash functions service owners know from api-syncagent (sha3sum,
// sha3short, shortHash) and ferry's hash. Output is whitespace-trimmed, and
// a missing key is an error rather than "<no value>" so a typo fails loudly
// instead of naming an object "<no value>".
package templating

import (
	"bytes"
	"crypto/sha1" //nolint:gosec // shortHash and hash are names, not security: the same values api-syncagent and ferry's naming produce
	"crypto/sha3"
	"encoding/hex"
	"fmt"
	"strings"
	"text/template"

	"github.com/Masterminds/sprig/v3"
)

// Template is a parsed template.
type Template struct {
	t *template.Template
}

// Data is what a template sees: {{ .Object.metadata.name }} reads
// Data{"Object": ...}. Which keys are set depends on where the template is
// used (see the README's template table).
type Data map[string]any

// shortHashLength is how many hex characters shortHash, hash and sha3short
// (by default) keep.
const shortHashLength = 20

// funcs returns the function map of every template.
func funcs() template.FuncMap {
	f := sprig.TxtFuncMap()
	// The edge's environment holds no data for templates to read.
	delete(f, "env")
	delete(f, "expandenv")
	f["sha3sum"] = func(s string) string {
		sum := sha3.Sum256([]byte(s))
		return hex.EncodeToString(sum[:])
	}
	f["sha3short"] = func(s string, length ...int) (string, error) {
		n := shortHashLength
		if len(length) > 1 {
			return "", fmt.Errorf("sha3short takes at most one length, got %d", len(length))
		}
		if len(length) == 1 {
			n = length[0]
		}
		sum := sha3.Sum256([]byte(s))
		h := hex.EncodeToString(sum[:])
		if n < 1 || n > len(h) {
			return "", fmt.Errorf("sha3short: length %d is not between 1 and %d", n, len(h))
		}
		return h[:n], nil
	}
	sha1Short := func(s string) string {
		sum := sha1.Sum([]byte(s)) //nolint:gosec // see import
		return hex.EncodeToString(sum[:])[:shortHashLength]
	}
	f["shortHash"] = sha1Short
	f["hash"] = sha1Short
	return f
}

// Parse parses text; name appears in errors (e.g. the field it came from).
func Parse(name, text string) (*Template, error) {
	t, err := template.New(name).Option("missingkey=error").Funcs(funcs()).Parse(text)
	if err != nil {
		return nil, fmt.Errorf("%s is not a valid Go template: %w", name, err)
	}
	return &Template{t: t}, nil
}

// Execute runs the template on data; the output is whitespace-trimmed.
func (t *Template) Execute(data Data) (string, error) {
	var buf bytes.Buffer
	if err := t.t.Execute(&buf, map[string]any(data)); err != nil {
		return "", fmt.Errorf("template %s: %w", t.t.Name(), err)
	}
	return strings.TrimSpace(buf.String()), nil
}
