package agent

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"strconv"
	"strings"
	"testing"
	"time"
)

// What the agent protocol parses comes from code that may be hostile: the agent reads request lines from an
// abstract socket that sandbox code can connect to, the interpreter (repl.py, which runs the user's code) sends
// JSON lines and writes sync markers into its stdout/stderr, and the server's client reads the agent's event
// lines. The targets below feed arbitrary bytes to each parser: none may panic, hang, or hold more memory than
// its limit.

// FuzzReadLine checks the JSON-lines framing (readLine, with a tiny bufio buffer so that long lines arrive in
// pieces) against a reference split of the input, and decodes every line as a Request, an Event and a
// message of the interpreter.
func FuzzReadLine(f *testing.F) {
	for _, s := range []string{
		"", "\n", "{}\n", `{"op":"ping"}` + "\n" + `{"op":"exec","argv":["ls"]}` + "\n",
		`{"type":"stdout","data":"x"}` + "\r\n" + `{"type":"result","value":"1"}`,
		strings.Repeat("x", 100) + "\n" + "short\n", "a\r\r\n\rb\n\n", "no newline at the end",
		`{"op":"run_code","code":"` + strings.Repeat("\\u0000", 20) + `"}` + "\n",
		`{"type":"ok","pids":[1,2,3],"skipped":[{"name":"x","reason":"y"}]}`, `{"type":1}`, `[`, "\xff\xfe\n",
	} {
		f.Add([]byte(s), uint16(40))
	}
	f.Fuzz(func(t *testing.T, data []byte, limit uint16) {
		r := bufio.NewReaderSize(bytes.NewReader(data), 16)
		want := strings.Split(string(data), "\n")
		for i := range want[:len(want)-1] {
			want[i] = strings.TrimSuffix(want[i], "\r") // "\r\n" ends a line too
		}
		if want[len(want)-1] == "" {
			want = want[:len(want)-1] // no line after the last newline
		}
		for i := 0; ; i++ {
			line, err := readLine(r, int(limit))
			if i == len(want) {
				if err != io.EOF {
					t.Fatalf("after the last line: %q, %v; want EOF", line, err)
				}
				return
			}
			w := want[i]
			if len(w) > int(limit) {
				if err == nil || !strings.Contains(err.Error(), "longer than") {
					t.Fatalf("line %d of %d bytes (limit %d): got %d bytes, %v; want the limit's error", i, len(w), limit, len(line), err)
				}
				return // every caller drops the connection here
			}
			if err == io.EOF && i == len(want)-1 && !bytes.HasSuffix(data, []byte("\n")) {
				return // a last line cut short by the peer's hang-up may be dropped (or read, below)
			}
			if err != nil || string(line) != w {
				t.Fatalf("line %d: got %q, %v; want %q", i, line, err, w)
			}
			if len(line) > int(limit) {
				t.Fatalf("line of %d bytes over the limit %d", len(line), limit)
			}
			var req Request
			var ev Event
			var m replMsg
			json.Unmarshal(line, &req) //nolint:errcheck // must not panic; the callers answer errors
			json.Unmarshal(line, &ev)  //nolint:errcheck
			json.Unmarshal(line, &m)   //nolint:errcheck
			ev.Terminal()
		}
	})
}

// splitMarkers is the reference parse of an interpreter output stream: the bytes that are output, and the
// count of the last sync marker ("\x00ramify-sync:<n>\x00", n 1 to maxSyncDigits ASCII digits; -1: none).
func splitMarkers(data []byte) ([]byte, int) {
	var out []byte
	last := -1
	for len(data) > 0 {
		i := bytes.Index(data, syncPrefix)
		if i < 0 {
			return append(out, data...), last
		}
		out = append(out, data[:i]...)
		rest := data[i+len(syncPrefix):]
		end := bytes.IndexByte(rest, 0)
		if end < 1 || end > maxSyncDigits || strings.Trim(string(rest[:end]), "0123456789") != "" {
			out = append(out, data[i])
			data = data[i+1:]
			continue
		}
		n, _ := strconv.Atoi(string(rest[:end]))
		last = n
		data = rest[end+1:]
	}
	return out, last
}

// FuzzSyncMarkers feeds an output stream, cut into writes at the given lengths, through streamWriter (which
// strips the interpreter's sync markers from its stdout/stderr). Whatever the cuts, what it forwards plus what
// it holds back is the stream without its markers, the last marker's count is recorded, and what it holds back
// stays small: sandbox code that writes a marker's prefix and then a gigabyte cannot make the agent buffer it.
func FuzzSyncMarkers(f *testing.F) {
	for _, s := range []string{
		"plain output", "a\x00ramify-sync:3\x00b", "\x00ramify-sync:12\x00\x00ramify-sync:13\x00",
		"\x00ramify-sy", "\x00ramify-sync:", "\x00ramify-sync:99999999999999999999999\x00after",
		"\x00ramify-sync:abc\x00x", "\x00ramify-sync:" + strings.Repeat("A", 4096) + "held back?",
		"\x00\x00ramify-sync:1\x00", "x\x00ramify-sync:-5\x00y\x00ramify-sync:7", "\x00ramify-sync:after-marker\n",
		"\x00ramify-sync:\x00", "\x00ramify-sync:12 \x00",
	} {
		f.Add([]byte(s), []byte{1, 5, 13})
		f.Add([]byte(s), []byte{})
	}
	f.Fuzz(func(t *testing.T, data, cuts []byte) {
		p := &repl{turn: make(chan struct{}, 1)}
		var got []byte
		p.sink = func(ev Event) {
			if ev.Type != "stdout" {
				t.Fatalf("event of type %q", ev.Type)
			}
			got = append(got, ev.Data...)
		}
		w := &streamWriter{p: p, typ: "stdout"}
		rest := data
		for _, c := range cuts {
			n := min(int(c), len(rest))
			if k, err := w.Write(rest[:n]); k != n || err != nil {
				t.Fatalf("Write: %d, %v", k, err)
			}
			rest = rest[n:]
			if len(w.pending) > len(syncPrefix)+maxSyncDigits {
				t.Fatalf("holds back %d bytes", len(w.pending))
			}
		}
		w.Write(rest)
		if len(w.pending) > len(syncPrefix)+maxSyncDigits {
			t.Fatalf("holds back %d bytes", len(w.pending))
		}
		wantOut, wantLast := splitMarkers(data)
		if all := append(got, w.pending...); !bytes.Equal(all, wantOut) && !(len(all) == 0 && len(wantOut) == 0) {
			t.Fatalf("forwarded %q + held back %q, want %q", got, w.pending, wantOut)
		}
		if gotLast, ok := p.synced["stdout"]; (wantLast >= 0 || ok) && gotLast != wantLast {
			t.Fatalf("recorded sync %d (%v), want %d", gotLast, ok, wantLast)
		}
		// The interpreter's own marker after the run's output is recognised, and nothing of the output is lost,
		// unless the output itself ends in an unfinished marker (the pieces then join, as they would anyway).
		if len(w.pending) == 0 {
			n := len(data) + 1
			got = got[:0]
			w.Write([]byte("\x00ramify-sync:" + strconv.Itoa(n) + "\x00"))
			if p.synced["stdout"] != n || len(got) != 0 || len(w.pending) != 0 {
				t.Fatalf("after %q the interpreter's marker was not recognised: sync %d, forwarded %q, held %q",
					data, p.synced["stdout"], got, w.pending)
			}
		}
	})
}

// streamConn is a net.Conn whose reads come from a fixed stream and whose writes are dropped.
type streamConn struct {
	net.Conn // nil: the methods not defined here are not used
	r        io.Reader
}

func (c *streamConn) Read(b []byte) (int, error)         { return c.r.Read(b) }
func (c *streamConn) Write(b []byte) (int, error)        { return len(b), nil }
func (c *streamConn) Close() error                       { return nil }
func (c *streamConn) SetDeadline(t time.Time) error      { return nil }
func (c *streamConn) SetReadDeadline(t time.Time) error  { return nil }
func (c *streamConn) SetWriteDeadline(t time.Time) error { return nil }

// FuzzClientEvents has the server's agent client read an arbitrary answer to a call: it returns (the stream
// ends, so it may not wait), hands every non-terminal event to the callback in order, and succeeds only with
// a terminal event that is not an error.
func FuzzClientEvents(f *testing.F) {
	for _, s := range []string{
		`{"type":"stdout","data":"a"}` + "\n" + `{"type":"result","stdout":"a","execution_count":1}` + "\n",
		`{"type":"exit","exit_code":3}` + "\n", `{"type":"error","message":"boom"}` + "\n",
		`{"type":"stdout"}` + "\n", "", "\n", "garbage\n", `{"type":"ok","pids":[1]}`,
		`{"type":"stderr","data":"x"}` + "\n" + `{"type":"ok"}` + "\n" + `{"type":"exit"}` + "\n",
		`{"type":"result","error":{"name":"E","value":"v","traceback":"t"}}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, stream []byte) {
		dials := 0
		c := NewClient(func(ctx context.Context) (net.Conn, error) {
			dials++
			if dials > 1 {
				return &streamConn{r: bytes.NewReader(nil)}, nil // the retry after a stale connection
			}
			return &streamConn{r: bytes.NewReader(stream)}, nil
		})
		defer c.Close()
		var events []Event
		ev, err := c.RunCode(context.Background(), RunCodeRequest{Code: "1"}, func(e Event) { events = append(events, e) })
		for _, e := range events {
			if e.Terminal() {
				t.Fatalf("terminal event %q passed to the callback", e.Type)
			}
		}
		if err == nil && (!ev.Terminal() || ev.Type == "error") {
			t.Fatalf("succeeded with event %+v", ev)
		}
		if err != nil && !errors.Is(err, ErrAgentGone) && !strings.HasPrefix(err.Error(), "agent: ") &&
			!strings.HasPrefix(err.Error(), "agent sent a bad event") {
			t.Fatalf("unexpected error %v", err)
		}
		// Replaying the lines the client must have read gives the same events.
		lines := strings.Split(string(stream), "\n")
		n := 0
		for _, l := range lines {
			var e Event
			if json.Unmarshal([]byte(strings.TrimSuffix(l, "\r")), &e) != nil || e.Terminal() {
				break
			}
			n++
		}
		if n < len(events) {
			t.Fatalf("%d events from a stream of %d leading non-terminal lines", len(events), n)
		}
	})
}
