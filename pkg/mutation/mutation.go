// Package mutation applies a PublishedResource's mutations — delete, regex,
// Go template or CEL rewrites of single fields — to objects on their way
// between kcp and the service cluster. Mutations are compiled once per
// PublishedResource (Compile) and applied per object (Apply); a mutation
// that cannot be applied to an object returns an error naming the step, for
// the object's nack or report, and never panics.
package mutation

import (
	"errors"
	"fmt"
	"reflect"
	"regexp"

	"github.com/google/cel-go/cel"
	"github.com/google/cel-go/ext"
	"google.golang.org/protobuf/types/known/structpb"

	ferryv1alpha1 "github.com/ferry-dev/ferry/api/v1alpha1"
	"github.com/ferry-dev/ferry/pkg/fieldpath"
	"github.com/ferry-dev/ferry/pkg/naming"
	"github.com/ferry-dev/ferry/pkg/replacement"
	"github.com/ferry-dev/ferry/pkg/templating"
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
	// tmpl is a template step's template, for Check.
	tmpl *templating.Template
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
	if mut.Rudi != nil {
		return step{}, fmt.Errorf("%s.rudi: Rudi is not supported: write it as cel (a cel mutation with path and expression)", name)
	}
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
		t, err := templating.Parse(name+".template.template", mut.Template.Template)
		if err != nil {
			return step{}, err
		}
		return step{name: name + ".template", path: path, tmpl: t, apply: func(obj map[string]any, p fieldpath.Path, objs Objects) error {
			value, _ := p.Get(obj)
			out, err := t.Execute(templateData(obj, value, objs))
			if err != nil {
				return err
			}
			return p.Set(obj, out)
		}}, nil
	default:
		path, err := parse("cel", mut.CEL.Path)
		if err != nil {
			return step{}, err
		}
		return compileCEL(name+".cel", path, mut.CEL.Expression)
	}
}

// templateData is what a template mutation sees (pkg/templating): the
// mutated object, the objects on both sides under ferry's names (.Local,
// .Remote) and the seeds' (.LocalObject, .RemoteObject — the mutated
// object stands in for a side not at hand, e.g. the local copy before it
// exists, whose name and namespace the mutated object already has), the
// current value and the kcp workspace.
func templateData(obj map[string]any, value any, objs Objects) templating.Data {
	local, remote := templating.Object(objs.Local), templating.Object(objs.Remote)
	localView, remoteView := local, remote
	if localView == nil {
		localView = obj
	}
	if remoteView == nil {
		remoteView = obj
	}
	d := templating.Data{
		Object: obj, Local: local, Remote: remote, LocalObject: localView, RemoteObject: remoteView, Value: value,
	}
	// The copy's ferry labels and annotations name the kcp workspace.
	for _, o := range []map[string]any{obj, objs.Local} {
		meta, _ := o["metadata"].(map[string]any)
		labels, _ := meta["labels"].(map[string]any)
		annotations, _ := meta["annotations"].(map[string]any)
		if c, ok := labels[naming.LabelRemoteCluster].(string); ok && d.ClusterName == "" {
			d.ClusterName = c
		}
		if p, ok := annotations[naming.AnnotationWorkspacePath].(string); ok && d.ClusterPath == "" {
			d.ClusterPath, d.WorkspacePath = p, p
		}
	}
	return d
}

// Check runs the template steps on sample data (templating.Check): a
// template that would fail on every object — data the model lacks — is an
// error naming the step.
func (m *Mutator) Check(sample templating.Data) error {
	if m == nil {
		return nil
	}
	var errs []error
	for _, s := range m.steps {
		if s.tmpl != nil {
			errs = append(errs, s.tmpl.Check(sample))
		}
	}
	return errors.Join(errs...)
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
