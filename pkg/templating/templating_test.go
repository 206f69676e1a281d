package templating

import (
	"strings"
	"testing"
)

func remoteObject() Object {
	return Object{
		"apiVersion": "kcp.example/v1", "kind": "Database",
		"metadata": map[string]any{"name": "db1", "namespace": "team-a", "labels": map[string]any{"tier": "gold"}},
		"spec":     map[string]any{"secretName": "db1-creds"},
	}
}

func localObject() Object {
	return Object{
		"apiVersion": "example.com/v1", "kind": "Database",
		"metadata": map[string]any{"name": "abc-def", "namespace": "wsns"},
	}
}

func data() Data {
	remote, local := remoteObject(), localObject()
	return Data{
		Object: remote, Remote: remote, Local: local, RemoteObject: remote, LocalObject: local,
		ClusterName: "1x2y3z", ClusterPath: "root:org:team", WorkspacePath: "root:org:team",
		Namespace: "team-a", Name: "db1", Value: "old", Side: "kcp",
	}
}

func TestExecute(t *testing.T) {
	tests := []struct {
		name, text, want, wantErr string
	}{
		// The seeds' mutation example.
		{name: "seeds: typed local metadata", text: "{{ .LocalObject.ObjectMeta.Namespace }}", want: "wsns"},
		{name: "seeds: typed labels", text: "{{ .RemoteObject.ObjectMeta.Labels.tier }}", want: "gold"},
		{name: "seeds: typed kind", text: "{{ .RemoteObject.TypeMeta.Kind }}", want: "Database"},
		{name: "seeds' objects read as maps too", text: "{{ .LocalObject.metadata.name }}", want: "abc-def"},
		// api-syncagent's naming example.
		{name: "api-syncagent: naming", text: "{{ .ClusterName }}-{{ .Object.metadata.namespace | sha3short }}",
			want: "1x2y3z-" + sha3sum("team-a")[:20]},
		{name: "api-syncagent: sha3sum", text: "{{ .Object.spec.secretName | sha3sum }}", want: sha3sum("db1-creds")},
		{name: "api-syncagent: sha3short with a length", text: "{{ sha3short .Name 8 }}", want: sha3sum("db1")[:8]},
		{name: "api-syncagent: sha3short piped with a length", text: "{{ .Name | sha3short 8 }}", want: sha3sum("db1")[:8]},
		{name: "api-syncagent: shortHash", text: "{{ shortHash .Name }}", want: shortHash("db1")},
		{name: "api-syncagent: cluster path", text: "{{ .ClusterPath }}", want: "root:org:team"},
		// ferry's current names.
		{name: "ferry: naming data", text: "{{ .ClusterName }}-{{ .Namespace }}-{{ hash .Name }}", want: "1x2y3z-team-a-" + shortHash("db1")},
		{name: "ferry: workspace path", text: "{{ .WorkspacePath }}", want: "root:org:team"},
		{name: "ferry: mutation data", text: "{{ .Remote.metadata.namespace }}/{{ .Local.metadata.name }}/{{ .Value }}", want: "team-a/abc-def/old"},
		{name: "sprig", text: `{{ list "a" "b" | join "," | upper }}`, want: "A,B"},
		{name: "output trimmed", text: "  {{ .Name }}\n", want: "db1"},
		{name: "missing key", text: "{{ .Object.spec.nope }}", wantErr: `map has no entry for key "nope"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tmpl, err := Parse("t", tt.text)
			if err != nil {
				t.Fatal(err)
			}
			got, err := tmpl.Execute(data())
			if tt.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("error %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil || got != tt.want {
				t.Fatalf("Execute = %q, %v; want %q", got, err, tt.want)
			}
		})
	}
}

// TestCheck: at publish time a template is refused only for what fails on
// every object.
func TestCheck(t *testing.T) {
	tests := []struct {
		name, text string
		// wantErr is part of the refusal; empty: accepted.
		wantErr string
		// parse: refused by Parse already.
		parse bool
	}{
		{name: "seeds' template", text: "{{ .LocalObject.ObjectMeta.Namespace }}"},
		{name: "api-syncagent's naming", text: "{{ .ClusterName }}-{{ .Object.metadata.namespace | sha3short }}"},
		{name: "a field the sample lacks", text: "{{ .Object.spec.secretName }}"},
		{name: "a deep field the sample lacks", text: "{{ .Remote.spec.a.b.c | upper }}"},
		{name: "the value read as an object", text: "{{ .Value.name }}"},
		{name: "the value read as a string", text: "{{ .Value | upper }}"},
		{name: "unknown top-level data", text: "{{ .Objekt.metadata.name }}", wantErr: "can't evaluate field Objekt"},
		{name: "a typo in a typed view", text: "{{ .LocalObject.ObjectMeta.Namespce }}", wantErr: "can't evaluate field Namespce"},
		{name: "unknown function", text: "{{ sha256 .Name }}", wantErr: `function "sha256" not defined`, parse: true},
		{name: "env is not available", text: "{{ env \"HOME\" }}", wantErr: `function "env" not defined`, parse: true},
		{name: "syntax", text: "{{ .Name ", wantErr: "unclosed action", parse: true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tmpl, err := Parse("spec.naming.name", tt.text)
			if tt.parse {
				if err == nil || !strings.Contains(err.Error(), tt.wantErr) {
					t.Fatalf("Parse error %v, want %q", err, tt.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			err = tmpl.Check(SampleData("example.com/v1", "Database", true))
			if tt.wantErr == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) || !strings.Contains(err.Error(), "spec.naming.name") {
				t.Fatalf("Check = %v, want a refusal naming the field and %q", err, tt.wantErr)
			}
		})
	}
}
