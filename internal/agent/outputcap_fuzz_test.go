package agent

import (
	"encoding/json"
	"strings"
	"testing"
)

// FuzzOutputCap checks the output cap of run_code and exec (capped, capField): what it keeps is a prefix of the
// output cut at a character boundary, and its size in the JSON event line, as encoding/json writes it, is at
// most the limit; the cost function (jsonCost) never counts less than encoding/json writes. This is what keeps
// the agent's result events below the client's line limit (maxEvent) whatever bytes sandbox code prints.
func FuzzOutputCap(f *testing.F) {
	for _, s := range []string{"plain", "\x00\x01\x1f", "<&>\"\\\n\t\b\f", "\xff\xfe\xc3", "é\u2028\u2029😀", ""} {
		f.Add(s, s+s, uint16(10))
	}
	f.Fuzz(func(t *testing.T, a, b string, limit uint16) {
		var c capped
		c.limit = int(limit)
		c.add(a)
		c.add(b)
		got, cut := strings.CutSuffix(c.sb.String(), truncatedNote)
		if cut != c.truncated {
			t.Fatalf("truncated %v, output %q", c.truncated, c.sb.String())
		}
		if !strings.HasPrefix(a+b, got) || (!c.truncated && got != a+b) {
			t.Fatalf("kept %q of %q", got, a+b)
		}
		if enc, _ := json.Marshal(got); len(enc)-2 > c.limit {
			t.Fatalf("kept %q: %d bytes encoded, limit %d", got, len(enc)-2, c.limit)
		}
		field, _ := strings.CutSuffix(capField(a+b, int(limit)), truncatedNote)
		if enc, _ := json.Marshal(field); len(enc)-2 > int(limit) || !strings.HasPrefix(a+b, field) {
			t.Fatalf("capField kept %q (%d bytes encoded), limit %d", field, len(enc)-2, limit)
		}
		all, _ := json.Marshal(a + b)
		n := 0
		for s := a + b; s != ""; {
			k, w := jsonCost(s)
			n += k
			s = s[w:]
		}
		if n < len(all)-2 { // more is safe (the cap is then stricter); \b and \f are counted as \u0008, \u000c
			t.Fatalf("cost of %q: %d, encoding/json writes %d bytes", a+b, n, len(all)-2)
		}
	})
}
