package threeway

import (
	"reflect"
	"testing"

	utiljson "k8s.io/apimachinery/pkg/util/json"
)

func obj(t *testing.T, s string) map[string]any {
	t.Helper()
	if s == "" {
		return nil
	}
	var m map[string]any
	if err := utiljson.Unmarshal([]byte(s), &m); err != nil {
		t.Fatalf("%s: %v", s, err)
	}
	return m
}

func TestMerge(t *testing.T) {
	tests := []struct {
		name                   string
		last, desired, current string
		want                   string
		removed                []string
	}{
		{
			name: "no last state: desired wins everywhere",
			last: ``, desired: `{"spec":{"x":1,"y":"a"}}`, current: `{"spec":{"x":2,"y":"b"}}`,
			want: `{"spec":{"x":1,"y":"a"}}`,
		},
		{
			name: "a local edit survives while desired does not change the field",
			last: `{"spec":{"x":1}}`, desired: `{"spec":{"x":1}}`, current: `{"spec":{"x":2}}`,
			want: `{"spec":{"x":2}}`,
		},
		{
			name: "desired changes the field: its new value wins over the local edit",
			last: `{"spec":{"x":1}}`, desired: `{"spec":{"x":3}}`, current: `{"spec":{"x":2}}`,
			want: `{"spec":{"x":3}}`,
		},
		{
			name: "an unrelated desired change keeps the local edit",
			last: `{"spec":{"x":1,"y":"a"}}`, desired: `{"spec":{"x":1,"y":"b"}}`, current: `{"spec":{"x":2,"y":"a"}}`,
			want: `{"spec":{"x":2,"y":"b"}}`,
		},
		{
			name: "a field removed locally stays removed",
			last: `{"spec":{"x":1,"y":"a"}}`, desired: `{"spec":{"x":1,"y":"a"}}`, current: `{"spec":{"y":"a"}}`,
			want: `{"spec":{"y":"a"}}`,
		},
		{
			name: "a field removed locally comes back when desired changes it",
			last: `{"spec":{"x":1}}`, desired: `{"spec":{"x":5}}`, current: `{"spec":{}}`,
			want: `{"spec":{"x":5}}`,
		},
		{
			name: "a field desired adds is set",
			last: `{"spec":{"x":1}}`, desired: `{"spec":{"x":1,"z":true}}`, current: `{"spec":{"x":1}}`,
			want: `{"spec":{"x":1,"z":true}}`,
		},
		{
			name: "a field desired removes is left out and reported when the copy holds it",
			last: `{"spec":{"x":1,"y":"a"}}`, desired: `{"spec":{"x":1}}`, current: `{"spec":{"x":1,"y":"edited"}}`,
			want: `{"spec":{"x":1}}`, removed: []string{"spec.y"},
		},
		{
			name: "a field desired removes that the copy removed too is not reported",
			last: `{"spec":{"x":1,"y":"a"}}`, desired: `{"spec":{"x":1}}`, current: `{"spec":{"x":1}}`,
			want: `{"spec":{"x":1}}`,
		},
		{
			name: "fields others set are not claimed, even inside desired's maps",
			last: `{"spec":{"x":1}}`, desired: `{"spec":{"x":1}}`, current: `{"spec":{"x":1,"defaulted":"d"},"extra":{"k":"v"}}`,
			want: `{"spec":{"x":1}}`,
		},
		{
			name:    "nested maps merge key by key",
			last:    `{"spec":{"db":{"size":"s","tier":"gold","opts":{"a":"1"}}}}`,
			desired: `{"spec":{"db":{"size":"m","tier":"gold","opts":{"a":"1","b":"2"}}}}`,
			current: `{"spec":{"db":{"size":"s","tier":"silver","opts":{"a":"9"}}}}`,
			want:    `{"spec":{"db":{"size":"m","tier":"silver","opts":{"a":"9","b":"2"}}}}`,
		},
		{
			name: "a map removed locally: only the keys desired changed come back",
			last: `{"spec":{"db":{"size":"s","tier":"gold"}}}`, desired: `{"spec":{"db":{"size":"m","tier":"gold"}}}`, current: `{"spec":{}}`,
			want: `{"spec":{"db":{"size":"m"}}}`,
		},
		{
			name: "a map removed locally and unchanged by desired stays removed",
			last: `{"spec":{"db":{"size":"s"}}}`, desired: `{"spec":{"db":{"size":"s"}}}`, current: `{"spec":{}}`,
			want: `{"spec":{}}`,
		},
		{
			name: "a nested field desired removes is reported",
			last: `{"spec":{"db":{"size":"s","tier":"gold"}}}`, desired: `{"spec":{"db":{"size":"s"}}}`, current: `{"spec":{"db":{"size":"s","tier":"gold"}}}`,
			want: `{"spec":{"db":{"size":"s"}}}`, removed: []string{"spec.db.tier"},
		},
		{
			name: "a whole top-level field desired removes is reported",
			last: `{"spec":{"x":1},"data":{"k":"v"}}`, desired: `{"spec":{"x":1}}`, current: `{"spec":{"x":1},"data":{"k":"v"}}`,
			want: `{"spec":{"x":1}}`, removed: []string{"data"},
		},
		{
			name: "lists are single values: a local edit survives while desired keeps the list",
			last: `{"spec":{"ports":[80,443]}}`, desired: `{"spec":{"ports":[80,443]}}`, current: `{"spec":{"ports":[8080]}}`,
			want: `{"spec":{"ports":[8080]}}`,
		},
		{
			name: "lists are single values: desired's changed list replaces the local one",
			last: `{"spec":{"ports":[80,443]}}`, desired: `{"spec":{"ports":[80]}}`, current: `{"spec":{"ports":[8080,443]}}`,
			want: `{"spec":{"ports":[80]}}`,
		},
		{
			name:    "lists of maps are single values too",
			last:    `{"spec":{"rules":[{"host":"a"}]}}`,
			desired: `{"spec":{"rules":[{"host":"a"}]}}`,
			current: `{"spec":{"rules":[{"host":"a","path":"/x"}]}}`,
			want:    `{"spec":{"rules":[{"host":"a","path":"/x"}]}}`,
		},
		{
			name: "a type change on the desired side wins",
			last: `{"spec":{"x":{"a":1}}}`, desired: `{"spec":{"x":"flat"}}`, current: `{"spec":{"x":{"a":2}}}`,
			want: `{"spec":{"x":"flat"}}`,
		},
		{
			name: "a type change on the local side survives while desired does not change the field",
			last: `{"spec":{"x":"flat"}}`, desired: `{"spec":{"x":"flat"}}`, current: `{"spec":{"x":{"a":2}}}`,
			want: `{"spec":{"x":{"a":2}}}`,
		},
		{
			name: "a map desired changes that the copy holds as a scalar: desired wins",
			last: `{"spec":{"x":{"a":1}}}`, desired: `{"spec":{"x":{"a":2}}}`, current: `{"spec":{"x":"flat"}}`,
			want: `{"spec":{"x":{"a":2}}}`,
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			last, desired, current := obj(t, tt.last), obj(t, tt.desired), obj(t, tt.current)
			got, removed := Merge(last, desired, current)
			if want := obj(t, tt.want); !reflect.DeepEqual(got, want) {
				t.Errorf("merged = %v, want %v", got, want)
			}
			var paths []string
			for _, p := range removed {
				paths = append(paths, p.String())
			}
			if !reflect.DeepEqual(paths, tt.removed) {
				t.Errorf("removed = %v, want %v", paths, tt.removed)
			}
			// The inputs are not modified.
			if !reflect.DeepEqual(last, obj(t, tt.last)) || !reflect.DeepEqual(desired, obj(t, tt.desired)) || !reflect.DeepEqual(current, obj(t, tt.current)) {
				t.Error("Merge modified its inputs")
			}
		})
	}
}

// TestMergeSharesNothing: writing into the result never reaches the inputs.
func TestMergeSharesNothing(t *testing.T) {
	desired := obj(t, `{"spec":{"x":{"a":1},"l":[1]}}`)
	current := obj(t, `{"spec":{"x":{"a":1},"l":[2]}}`)
	last := obj(t, `{"spec":{"x":{"a":1},"l":[1]}}`)
	got, _ := Merge(last, desired, current)
	got["spec"].(map[string]any)["x"].(map[string]any)["a"] = int64(9)
	got["spec"].(map[string]any)["l"].([]any)[0] = int64(9)
	if desired["spec"].(map[string]any)["x"].(map[string]any)["a"] != int64(1) || current["spec"].(map[string]any)["l"].([]any)[0] != int64(2) {
		t.Error("the result shares values with the inputs")
	}
}
