package mcpserver

import (
	"context"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/ramify-dev/ramify/client"
)

// TestLimitCutsAtCharacters: a long text of multi-byte characters is cut to about MaxTextBytes without splitting
// a character, keeping its start and end; when the whole text cannot be saved (no server here) the note says so
// and how to get it another way.
func TestLimitCutsAtCharacters(t *testing.T) {
	tl := &tools{c: client.New("http://127.0.0.1:1", "k")}
	l := tl.limiter("sbx_x", "exec")
	in := "start" + strings.Repeat("é€😀", 20000) + "end"
	out := l.limit(context.Background(), "stdout", in)
	if !utf8.ValidString(out) || !strings.HasPrefix(out, "start") || !strings.HasSuffix(out, "end") {
		t.Fatalf("cut text: valid=%v, starts %q, ends %q", utf8.ValidString(out), out[:10], out[len(out)-10:])
	}
	if len(out) > MaxTextBytes+1024 {
		t.Errorf("cut text is %d bytes", len(out))
	}
	if len(l.cuts) != 1 {
		t.Fatalf("cuts = %+v", l.cuts)
	}
	c := l.cuts[0]
	kept := len(in) - c.Cut
	if c.Bytes != len(in) || c.SavedTo != "" || len(out) != kept+len("\n[... "+c.Note+" ...]\n") ||
		!strings.Contains(out, c.Note) || !strings.Contains(c.Note, "could not be saved") || !strings.Contains(c.Note, "read_file") {
		t.Errorf("cut = %+v (text %d bytes, out %d)", c, len(in), len(out))
	}
	if short := l.limit(context.Background(), "stderr", "short"); short != "short" || len(l.cuts) != 1 {
		t.Errorf("a short text was changed: %q, %d cuts", short, len(l.cuts))
	}
}

// TestTextEnd: a chunk of a file ends before a character split by the chunk's limit, and nowhere else.
func TestTextEnd(t *testing.T) {
	euro := []byte("€") // 3 bytes
	for _, c := range []struct {
		b, next []byte
		want    int
	}{
		{[]byte("abc"), []byte("def"), 3},
		{append([]byte("ab"), euro[:1]...), euro[1:], 2},
		{append([]byte("ab"), euro[:2]...), euro[2:], 2},
		{[]byte{0xff, 0xfe, 0x00, 0x01}, []byte{0x02}, 4}, // binary: no change
	} {
		if got := textEnd(c.b, c.next); got != c.want {
			t.Errorf("textEnd(%q, %q) = %d, want %d", c.b, c.next, got, c.want)
		}
	}
}
