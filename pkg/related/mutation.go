package related

import (
	"errors"
	"fmt"

	ferryv1alpha1 "github.com/ferry-dev/ferry/api/v1alpha1"
	"github.com/ferry-dev/ferry/pkg/mutation"
	"github.com/ferry-dev/ferry/pkg/templating"
)

// Mutations of related objects (spec.related[].mutation): the same steps
// as a PublishedResource's own mutation (delete, regex, template, cel),
// compiled once with the entry. They run where the related object is
// built for its destination side — the broker, which writes the copy in
// kcp (origin service) and sends the kcp object down (origin kcp):
//
//   - spec steps rewrite the object's content (everything but status) on
//     its way from its origin to the destination;
//   - status steps rewrite the status carried with syncStatus (origin
//     service only: the status travels with the object, from the service
//     cluster into kcp); without syncStatus no status travels, so status
//     steps are refused rather than never run.

// mutations is an entry's compiled mutation.
type mutations struct {
	spec, status *mutation.Mutator
}

func compileMutation(m *ferryv1alpha1.ResourceMutationSpec, syncStatus bool) (*mutations, error) {
	if m == nil || len(m.Spec) == 0 && len(m.Status) == 0 {
		return nil, nil
	}
	if len(m.Status) > 0 && !syncStatus {
		return nil, errors.New("mutation.status: a related object's status travels only with syncStatus: true (origin service); set it or drop the status steps")
	}
	var out mutations
	var errs []error
	var err error
	if out.spec, err = mutation.Compile("mutation.spec", m.Spec); err != nil {
		errs = append(errs, err)
	}
	if out.status, err = mutation.Compile("mutation.status", m.Status); err != nil {
		errs = append(errs, err)
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return &out, nil
}

// Mutates tells whether the entry has mutation steps.
func (r *Reference) Mutates() bool { return r.mutation != nil }

// MutateContent runs the entry's spec mutation steps on obj, a related
// object's content on its way to the destination side. objs are the
// related object on the service cluster (Local) and in kcp (Remote), as
// far as known; templates and CEL expressions may read them.
func (r *Reference) MutateContent(obj map[string]any, objs mutation.Objects) error {
	if r.mutation == nil || r.mutation.spec.Empty() {
		return nil
	}
	if err := r.mutation.spec.Apply(obj, objs); err != nil {
		return fmt.Errorf("related %q: %w", r.Identifier, err)
	}
	return nil
}

// MutateStatus runs the entry's status mutation steps on obj, the copy
// holding the status carried with syncStatus.
func (r *Reference) MutateStatus(obj map[string]any, objs mutation.Objects) error {
	if r.mutation == nil || r.mutation.status.Empty() {
		return nil
	}
	if err := r.mutation.status.Apply(obj, objs); err != nil {
		return fmt.Errorf("related %q: %w", r.Identifier, err)
	}
	return nil
}

// CheckMutation runs the entry's template steps on sample data (a sample
// object of the related kind): a template that would fail on every object
// — data the model lacks, e.g. .NoSuchField — is an
// error naming the step, refused with the PublishedResource.
func (r *Reference) CheckMutation(sample templating.Data) error {
	if r.mutation == nil {
		return nil
	}
	return errors.Join(r.mutation.spec.Check(sample), r.mutation.status.Check(sample))
}
