package mcpserver

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"strings"
	"unicode/utf8"
)

// MaxTextBytes is the most of one output stream (run_code's stdout, stderr and value, exec's stdout and stderr)
// a tool returns: a model pays for every byte it is shown. Longer text is cut in the middle (its start and, mostly,
// its end are kept), and the whole text is saved in a file of the sandbox, under OutputDir, for read_file.
const MaxTextBytes = 32 << 10

// OutputDir is the sandbox directory where cut outputs are saved whole. It is outside /root and /tmp, the
// directories diff compares by default, so that saved outputs do not show up as changes of a fork.
const OutputDir = "/var/tmp/ramify-mcp"

// headBytes of a cut text are kept from its start, the rest of MaxTextBytes from its end (where errors are).
const headBytes = MaxTextBytes / 4

// Truncation describes one output field that was cut.
type Truncation struct {
	Field string `json:"field" jsonschema:"the output field that was cut (stdout, stderr or value)"`
	Bytes int    `json:"bytes" jsonschema:"the field's whole size in bytes"`
	Cut   int    `json:"cut" jsonschema:"how many bytes were left out of the middle"`
	// SavedTo is empty when the whole output could not be saved; Note then says why.
	SavedTo string `json:"saved_to,omitempty" jsonschema:"the sandbox file holding the whole output: read it with read_file (offset, limit)"`
	Note    string `json:"note"`
}

// limiter cuts the output fields of one tool call and saves their whole text in the sandbox.
type limiter struct {
	t    *tools
	id   string // the sandbox
	tool string // "exec" or "run_code", for the file names
	tag  string // unique per call
	cuts []Truncation
}

func (t *tools) limiter(id, tool string) *limiter {
	var b [4]byte
	_, _ = rand.Read(b[:])
	return &limiter{t: t, id: id, tool: tool, tag: hex.EncodeToString(b[:])}
}

// limit returns s, or s cut to MaxTextBytes with a note where the cut is; a cut field is saved whole first.
func (l *limiter) limit(ctx context.Context, field, s string) string {
	if len(s) <= MaxTextBytes {
		return s
	}
	head := s[:runeStart(s, headBytes)]
	tail := s[runeStart(s, len(s)-(MaxTextBytes-headBytes)):]
	tr := Truncation{Field: field, Bytes: len(s), Cut: len(s) - len(head) - len(tail)}
	file := fmt.Sprintf("%s/%s-%s.%s", OutputDir, l.tool, l.tag, field)
	if _, err := l.t.c.WriteFile(ctx, l.id, file, strings.NewReader(s), 0); err != nil {
		tr.Note = fmt.Sprintf("%s was %d bytes: %d bytes were cut from its middle, and the whole text could not be saved in the sandbox (%v); "+
			"run it again with the output redirected to a file and read that with read_file (offset, limit)", field, tr.Bytes, tr.Cut, err)
	} else {
		tr.SavedTo = file
		tr.Note = fmt.Sprintf("%s was %d bytes: %d bytes were cut from its middle; the whole %s is in the sandbox's file %s: "+
			"read it with read_file (offset, limit), or search it with exec (grep, sed -n)", field, tr.Bytes, tr.Cut, field, file)
	}
	l.cuts = append(l.cuts, tr)
	return head + "\n[... " + tr.Note + " ...]\n" + tail
}

// runeStart returns the largest index <= i that starts a UTF-8 sequence of s (so that s[:i] and s[i:] stay
// valid text).
func runeStart(s string, i int) int {
	for i > 0 && i < len(s) && !utf8.RuneStart(s[i]) {
		i--
	}
	return i
}
