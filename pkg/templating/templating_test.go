package templating

import (
	"strings"
	"testing"
)

func TestExecute(t *testing.T) {
	obj := map[string]any{"metadata": map[string]any{"name": "db", "namespace": "team"}, "spec": map[string]any{"secretName": "creds"}}
	cases := []struct {
		name, text string
		data       Data
		want       string
		wantErr    string
	}{
		{name: "object path", text: "{{ .Object.spec.secretName }}", data: Data{"Object": obj}, want: "creds"},
		{name: "trimmed", text: "  {{ .Object.metadata.name }}\n", data: Data{"Object": obj}, want: "db"},
		{name: "side", text: `{{ if eq .Side "kcp" }}in-kcp{{ else }}local{{ end }}`, data: Data{"Side": "service"}, want: "local"},
		{name: "sprig", text: `{{ .Value | upper | trunc 3 }}`, data: Data{"Value": "secret"}, want: "SEC"},
		{name: "sha3sum", text: `{{ sha3sum "a" }}`, want: "80084bf2fba02475726feb2cab2d8215eab14bc6bdd8bfb2c8151257032ecd8b"},
		{name: "sha3short default", text: `{{ sha3short "a" }}`, want: "80084bf2fba02475726f"},
		{name: "sha3short length", text: `{{ sha3short "a" 8 }}`, want: "80084bf2"},
		{name: "shortHash is sha1", text: `{{ shortHash "a" }}`, want: "86f7e437faa5a7fce15d"},
		{name: "hash is ferry's naming hash", text: `{{ hash "a" }}`, want: "86f7e437faa5a7fce15d"},
		{name: "missing key fails", text: "{{ .Nope }}", data: Data{}, wantErr: "Nope"},
		{name: "env is not there", text: `{{ env "HOME" }}`, wantErr: "not defined"},
		{name: "expandenv is not there", text: `{{ expandenv "$HOME" }}`, wantErr: "not defined"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tmpl, err := Parse("t", tc.text)
			if err == nil {
				var got string
				got, err = tmpl.Execute(tc.data)
				if err == nil && got != tc.want {
					t.Errorf("got %q, want %q", got, tc.want)
				}
			}
			switch {
			case tc.wantErr == "" && err != nil:
				t.Fatalf("unexpected error: %v", err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Fatalf("error %v, want one containing %q", err, tc.wantErr)
			}
		})
	}
}
