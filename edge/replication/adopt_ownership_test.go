package replication

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

func fieldsEntry(manager string, op metav1.ManagedFieldsOperationType, subresource, fields string) metav1.ManagedFieldsEntry {
	return metav1.ManagedFieldsEntry{Manager: manager, Operation: op, Subresource: subresource, FieldsType: "FieldsV1",
		FieldsV1: &metav1.FieldsV1{Raw: []byte(fields)}}
}

func TestWithoutAdoptedFields(t *testing.T) {
	const (
		ferryOwns = `{"f:metadata":{"f:labels":{"f:team":{}}},"f:spec":{"f:size":{}}}`
		upd       = metav1.ManagedFieldsOperationUpdate
		apply     = metav1.ManagedFieldsOperationApply
	)
	ferry := fieldsEntry(FieldManager, apply, "", ferryOwns)
	for _, tc := range []struct {
		name        string
		in          []metav1.ManagedFieldsEntry
		wantChanged bool
		want        map[string]string // manager → fields left; absent = entry dropped
	}{{
		name: "the previous writer keeps only what ferry does not set",
		in: []metav1.ManagedFieldsEntry{fieldsEntry("api-syncagent", upd, "",
			`{"f:metadata":{"f:labels":{"f:team":{},"f:old":{}}},"f:spec":{"f:size":{},"f:legacy":{}}}`), ferry},
		wantChanged: true,
		want: map[string]string{"api-syncagent": `{"f:metadata":{"f:labels":{"f:old":{}}},"f:spec":{"f:legacy":{}}}`,
			FieldManager: ferryOwns},
	}, {
		name:        "a writer left with nothing is dropped",
		in:          []metav1.ManagedFieldsEntry{fieldsEntry("kubectl-create", upd, "", `{"f:spec":{"f:size":{}}}`), ferry},
		wantChanged: true,
		want:        map[string]string{FieldManager: ferryOwns},
	}, {
		name: "status, the service-owned manager and writers of other fields are left alone",
		in: []metav1.ManagedFieldsEntry{
			fieldsEntry("controller", upd, "status", `{"f:spec":{"f:size":{}},"f:status":{"f:phase":{}}}`),
			fieldsEntry(ServiceOwnedFieldManager, apply, "", `{"f:spec":{"f:size":{}}}`),
			fieldsEntry("autoscaler", upd, "", `{"f:spec":{"f:replicas":{}}}`),
			ferry,
		},
		want: map[string]string{"controller": `{"f:spec":{"f:size":{}},"f:status":{"f:phase":{}}}`,
			ServiceOwnedFieldManager: `{"f:spec":{"f:size":{}}}`, "autoscaler": `{"f:spec":{"f:replicas":{}}}`, FieldManager: ferryOwns},
	}, {
		name: "no apply of ferry's: nothing to take",
		in:   []metav1.ManagedFieldsEntry{fieldsEntry("api-syncagent", upd, "", `{"f:spec":{"f:size":{}}}`)},
		want: map[string]string{"api-syncagent": `{"f:spec":{"f:size":{}}}`},
	}} {
		t.Run(tc.name, func(t *testing.T) {
			out, changed, err := withoutAdoptedFields(tc.in, FieldManager, ServiceOwnedFieldManager)
			if err != nil {
				t.Fatal(err)
			}
			if changed != tc.wantChanged {
				t.Errorf("changed = %t, want %t", changed, tc.wantChanged)
			}
			got := map[string]string{}
			for _, mf := range out {
				got[mf.Manager] = string(mf.FieldsV1.Raw)
			}
			if len(got) != len(tc.want) {
				t.Errorf("managers %v, want %v", got, tc.want)
			}
			for m, w := range tc.want {
				if got[m] != w {
					t.Errorf("%s owns %s, want %s", m, got[m], w)
				}
			}
		})
	}

	t.Run("unreadable fields are an error, not a guess", func(t *testing.T) {
		_, _, err := withoutAdoptedFields([]metav1.ManagedFieldsEntry{fieldsEntry("x", upd, "", `{"f:spec":`), ferry}, FieldManager)
		if err == nil {
			t.Fatal("no error for unreadable managed fields")
		}
	})
}
