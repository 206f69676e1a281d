// Package mutation applies a PublishedResource's mutations — delete, regex,
// Go template or CEL rewrites of single fields — to objects on their way
// between kcp and the service cluster. Mutations are compiled once per
// PublishedResource (Compile) and applied per object (Apply); a mutation
// that cannot be applied to an object returns an error naming the step, for
// the object's nack or report, and never panics.
package mutation

import (
	"bytes"
	"errors"
	"fmt"
	"reflect"
	"regexp"
	"text/template"

	"github.com/google/cel-go/cel"
	"github.com/google/cel-go/ext"
	"google.golang.org/protobuf/types/known/structpb"

	ferryv1alpha1 "github.com/ferry-dev/ferry/api/v1alpha1"
	"github.com/ferry-dev/ferry/pkg/fieldpath"
	"github.com/ferry-dev/ferry/pkg/replacement"
)

// Objects are what templates and CEL expressions can read besides the
// mutated object itself.
type Objects struct {
	// Local is the object in the service cluster (nil when it does not exist
	// yet).
	Local map[string]any
	// Remote is the object in kcp (nil when not known).
	Remote map[string]any
}

// Mutator is a compiled list of mutations. Safe for concurrent use.
type Mutator struct {
	steps []step
}

type step struct {
	name  string // "spec.mutation.spec[2].regex", for errors
	path  fieldpath.Path
	apply func(obj map[string]any, path fieldpath.Path, objs Objects) error
}

// Compile checks and compiles mutations; field names errors after where
// they sit in the PublishedResource (e.g. "spec.mutation.spec").
func Compile(field string, ms []ferryv1alpha1.ResourceMutation) (*Mutator, error) {
	var errs []error
	m := &Mutator{}
	for i, mut := range ms {
		s, err := compileStep(fmt.Sprintf("%s[%d]", field, i), mut)
		if err != nil {
			errs = append(errs, err)
			continue
		}
		m.steps = append(m.steps, s)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return m, nil
}

func compileStep(name string, mut ferryv1alpha1.ResourceMutation) (step, error) {
	set := 0
	for _, b := range []bool{mut.Delete != nil, mut.Regex != nil, mut.Template != nil, mut.CEL != nil} {
		if b {
			set++
		}
	}
	if set != 1 {
		return step{}, fmt.Errorf("%s: set exactly one of delete, regex, template and cel", name)
	}
	parse := func(kind, p string) (fieldpath.Path, error) {
		path, err := fieldpath.Parse(p)
		if err != nil {
			return nil, fmt.Errorf("%s.%s.path: %w", name, kind, err)
		}
		return path, nil
	}
	switch {
	case mut.Delete != nil:
		path, err := parse("delete", mut.Delete.Path)
		return step{name: name + ".delete", path: path, apply: func(obj map[string]any, p fieldpath.Path, _ Objects) error {
			return p.Delete(obj)
		}}, err
	case mut.Regex != nil:
		path, err := parse("regex", mut.Regex.Path)
		if err != nil {
			return step{}, err
		}
		return compileRegex(name+".regex", path, mut.Regex.Pattern, mut.Regex.Replacement)
	case mut.Template != nil:
		path, err := parse("template", mut.Template.Path)
		if err != nil {
			return step{}, err
		}
		t, err := template.New(name).Option("missingkey=error").Parse(mut.Template.Template)
		if err != nil {
			return step{}, fmt.Errorf("%s.template.template: %w", name, err)
		}
		return step{name: name + ".template", path: path, apply: func(obj map[string]any, p fieldpath.Path, objs Objects) error {
			var buf bytes.Buffer
			value, _ := p.Get(obj)
			if err := t.Execute(&buf, map[string]any{"Object": obj, "Local": objs.Local, "Remote": objs.Remote, "Value": value}); err != nil {
				return err
			}
			return p.Set(obj, buf.String())
		}}, nil
	default:
		path, err := parse("cel", mut.CEL.Path)
		if err != nil {
			return step{}, err
		}
		return compileCEL(name+".cel", path, mut.CEL.Expression)
	}
}

// compileRegex rewrites the string at path; an empty pattern sets the
// replacement as a static value (the path need not exist then).
func compileRegex(name string, path fieldpath.Path, pattern, repl string) (step, error) {
	if pattern == "" {
		// A static value is not a regex replacement: it is set as written.
		return step{name: name, path: path, apply: func(obj map[string]any, p fieldpath.Path, _ Objects) error {
			return p.Set(obj, repl)
		}}, nil
	}
	re, err := regexp.Compile(pattern)
	if err != nil {
		return step{}, fmt.Errorf("%s.pattern: %w", name, err)
	}
	// \1 (the ancestors' spelling) and $1 (Go's) both refer to groups.
	expanded := replacement.Expand(repl)
	return step{name: name, path: path, apply: func(obj map[string]any, p fieldpath.Path, _ Objects) error {
		v, err := p.GetString(obj)
		if err != nil {
			return err
		}
		return p.Set(obj, re.ReplaceAllString(v, expanded))
	}}, nil
}

// compileCEL sets path to the value of expr, which sees self (the current
// value at path, null when absent), object (the mutated object), local and
// remote.
func compileCEL(name string, path fieldpath.Path, expr string) (step, error) {
	env, err := cel.NewEnv(
		cel.Variable("self", cel.DynType),
		cel.Variable("object", cel.MapType(cel.StringType, cel.DynType)),
		cel.Variable("local", cel.MapType(cel.StringType, cel.DynType)),
		cel.Variable("remote", cel.MapType(cel.StringType, cel.DynType)),
		ext.Strings(),
	)
	if err != nil {
		return step{}, fmt.Errorf("%s: %w", name, err)
	}
	ast, iss := env.Compile(expr)
	if iss.Err() != nil {
		return step{}, fmt.Errorf("%s.expression: %w", name, iss.Err())
	}
	prg, err := env.Program(ast, cel.CostLimit(1_000_000))
	if err != nil {
		return step{}, fmt.Errorf("%s.expression: %w", name, err)
	}
	return step{name: name, path: path, apply: func(obj map[string]any, p fieldpath.Path, objs Objects) error {
		self, _ := p.Get(obj)
		out, _, err := prg.Eval(map[string]any{"self": self, "object": obj, "local": orEmpty(objs.Local), "remote": orEmpty(objs.Remote)})
		if err != nil {
			return err
		}
		native, err := out.ConvertToNative(reflect.TypeOf(&structpb.Value{}))
		if err != nil {
			return fmt.Errorf("result %v cannot be stored in an object: %w", out, err)
		}
		return p.Set(obj, normalize(native.(*structpb.Value).AsInterface()))
	}}, nil
}

func orEmpty(m map[string]any) map[string]any {
	if m == nil {
		return map[string]any{}
	}
	return m
}

// normalize turns structpb numbers back into int64 where they are whole, as
// Kubernetes JSON decoding would.
func normalize(v any) any {
	switch t := v.(type) {
	case float64:
		if t == float64(int64(t)) {
			return int64(t)
		}
		return t
	case []any:
		for i := range t {
			t[i] = normalize(t[i])
		}
		return t
	case map[string]any:
		for k := range t {
			t[k] = normalize(t[k])
		}
		return t
	default:
		return v
	}
}

// Apply runs the mutations on obj in order; the first failure stops them.
func (m *Mutator) Apply(obj map[string]any, objs Objects) error {
	if m == nil {
		return nil
	}
	for _, s := range m.steps {
		if err := s.apply(obj, s.path, objs); err != nil {
			return fmt.Errorf("%s (path %s): %w", s.name, s.path, err)
		}
	}
	return nil
}

// Empty tells whether there is nothing to do.
func (m *Mutator) Empty() bool { return m == nil || len(m.steps) == 0 }
