package agent

import (
	"encoding/json"
	"strings"
	"testing"
)

// resultList holds a call's results to resultsLimit whatever the interpreter sends: a result that does not fit
// becomes a note, a note that does not fit is dropped, and text/plain is always there.
func TestResultListLimit(t *testing.T) {
	big := func(n int) map[string]json.RawMessage {
		b, _ := json.Marshal(strings.Repeat("x", n))
		return map[string]json.RawMessage{"text/plain": json.RawMessage(`"big"`), "text/html": b}
	}
	var l resultList
	if r, ok := l.add("display_data", big(10<<20)); !ok || len(r.Data) != 2 {
		t.Fatalf("first result: %v %d formats", ok, len(r.Data))
	}
	r, ok := l.add("display_data", big(10<<20))
	if !ok || len(r.Data) != 1 || !strings.Contains(string(r.Data["text/plain"]), "left out") {
		t.Fatalf("second result: %v %s", ok, r.Data["text/plain"])
	}
	if r, ok := l.add("execute_result", map[string]json.RawMessage{"image/png": json.RawMessage(`"iVBO"`)}); !ok ||
		string(r.Data["text/plain"]) != `""` || string(r.Data["image/png"]) != `"iVBO"` {
		t.Fatalf("a result without text/plain: %v %v", ok, r.Data)
	}
	l.add("display_data", big(resultsLimit-l.size-60)) // fill it to the brim
	if _, ok := l.add("display_data", big(100)); ok || l.size > resultsLimit {
		t.Fatalf("a note past the limit was kept: size %d", l.size)
	}
	if len(l.list) != 4 || l.size > resultsLimit {
		t.Fatalf("%d results, %d bytes", len(l.list), l.size)
	}
}
