package replacement

import (
	"regexp"
	"testing"
)

func TestExpand(t *testing.T) {
	tests := []struct {
		name, pattern, replacement, input, want string
	}{
		{name: "Go spelling", pattern: `^(.*)-creds$`, replacement: `$1-tls`, input: "db-creds", want: "db-tls"},
		{name: "Go braced spelling", pattern: `^(.*)-creds$`, replacement: `${1}x`, input: "db-creds", want: "dbx"},
		{name: "ancestors' spelling", pattern: `^(.*)-creds$`, replacement: `\1-tls`, input: "db-creds", want: "db-tls"},
		{name: "ancestors' spelling followed by a letter", pattern: `^(.*)-creds$`, replacement: `\1x`, input: "db-creds", want: "dbx"},
		{name: "several groups", pattern: `^(\w+)-(\w+)$`, replacement: `\2.\1`, input: "a-b", want: "b.a"},
		{name: "whole match", pattern: `b+`, replacement: `[\0]`, input: "abbc", want: "a[bb]c"},
		{name: "escaped backslash is literal", pattern: `^(.*)$`, replacement: `\\1`, input: "x", want: `\1`},
		{name: "other backslashes stay", pattern: `^(.*)$`, replacement: `\n\1`, input: "x", want: `\nx`},
		{name: "trailing backslash stays", pattern: `^(.*)$`, replacement: `\1\`, input: "x", want: `x\`},
		{name: "both spellings mixed", pattern: `^(a)(b)$`, replacement: `$1\2`, input: "ab", want: "ab"},
		{name: "named group", pattern: `^(?P<n>.*)$`, replacement: `${n}!`, input: "x", want: "x!"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := regexp.MustCompile(tt.pattern).ReplaceAllString(tt.input, Expand(tt.replacement))
			if got != tt.want {
				t.Errorf("Expand(%q) = %q: %q → %q, want %q", tt.replacement, Expand(tt.replacement), tt.input, got, tt.want)
			}
		})
	}
}
