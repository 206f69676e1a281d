// Package replacement reads regular-expression replacement strings in both
// spellings a PublishedResource may use: Go's ($1, ${1}, ${name}) and the
// one the seeds and api-syncagent document (\1 … \9, and \\ for a literal
// backslash). Every place ferry compiles a regex replacement goes through
// Expand, so the two spellings behave the same everywhere.
package replacement

import "strings"

// Expand returns replacement in Go's regexp.Expand syntax: \N (N a digit
// 1–9, or 0 for the whole match) becomes ${N} and \\ a single backslash.
// Go's own $-references are left as written, so "$1" and "\1" mean the same;
// any other backslash stays literal.
func Expand(replacement string) string {
	if !strings.Contains(replacement, `\`) {
		return replacement
	}
	var b strings.Builder
	b.Grow(len(replacement) + 8)
	for i := 0; i < len(replacement); i++ {
		c := replacement[i]
		if c != '\\' || i+1 == len(replacement) {
			b.WriteByte(c)
			continue
		}
		next := replacement[i+1]
		switch {
		case next >= '0' && next <= '9':
			// ${N}, braced so that a following letter or digit is not read
			// as part of the group name (Go reads "$1a" as group "1a").
			b.WriteString("${")
			b.WriteByte(next)
			b.WriteByte('}')
			i++
		case next == '\\':
			b.WriteByte('\\')
			i++
		default:
			b.WriteByte(c)
		}
	}
	return b.String()
}
