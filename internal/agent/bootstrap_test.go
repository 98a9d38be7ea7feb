package agent

import (
	"bytes"
	"crypto/sha256"
	"io"
	"os"
	"os/exec"
	"runtime"
	"strings"
	"testing"
)

// TestReplBootstrap runs the interpreter bootstrap with the host's python3 on payloads whose "loop" prints where
// it came from: the code compiled ahead when its magic number is this interpreter's and it was compiled from the
// source beside it; the source otherwise (another interpreter's code, a stale compiled file, none). Either way
// the loop finds the fork child helper that came with it.
func TestReplBootstrap(t *testing.T) {
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("no python3")
	}
	src := []byte("print('from the source', _ramify_fork_helper)\n")
	// compile has python3 compile code into a repl.pyc as scripts/compile-repl does, for the source hashed.
	compile := func(code string, hashed []byte) []byte {
		t.Helper()
		script := "import importlib.util, marshal, sys; sys.stdout.buffer.write(importlib.util.MAGIC_NUMBER + " +
			"marshal.dumps(compile(sys.stdin.read(), '<ramify-repl>', 'exec')))"
		c := exec.Command(py, "-c", script)
		c.Stdin = strings.NewReader(code)
		out, err := c.Output()
		if err != nil {
			t.Fatal(err)
		}
		sum := sha256.Sum256(hashed)
		return append(append(out[:4:4], sum[:]...), out[4:]...)
	}
	run := func(payload []byte) string {
		t.Helper()
		r, w, err := os.Pipe()
		if err != nil {
			t.Fatal(err)
		}
		go func() { w.Write(payload); w.Close() }()
		c := exec.Command(py, "-c", replBootstrap)
		c.ExtraFiles = []*os.File{r, r} // fd 3 (unused here) and fd 4
		out, err := c.CombinedOutput()
		r.Close()
		if err != nil {
			t.Fatalf("bootstrap: %v\n%s", err, out)
		}
		return strings.TrimSpace(string(out))
	}
	good := compile("print('compiled ahead', _ramify_fork_helper)\n", src)
	otherMagic := bytes.Clone(good)
	otherMagic[0] ^= 0xff
	for _, tc := range []struct {
		name string
		pyc  []byte
		want string
	}{
		{"compiled ahead from this source", good, "compiled ahead b'helper'"},
		{"another interpreter's code", otherMagic, "from the source b'helper'"},
		{"compiled from another source", compile("print('stale')\n", []byte("other source")), "from the source b'helper'"},
		{"none", nil, "from the source b'helper'"},
	} {
		var payload bytes.Buffer
		var pyc io.ReadSeeker
		if tc.pyc != nil {
			pyc = bytes.NewReader(tc.pyc)
		}
		if err := writeBootstrapPayload(&payload, string(src), pyc, []byte("helper")); err != nil {
			t.Fatal(err)
		}
		if got := run(payload.Bytes()); got != tc.want {
			t.Errorf("%s: the loop printed %q, want %q", tc.name, got, tc.want)
		}
	}
	var noHelper bytes.Buffer
	if err := writeBootstrapPayload(&noHelper, string(src), bytes.NewReader(good), nil); err != nil {
		t.Fatal(err)
	}
	if got := run(noHelper.Bytes()); got != "compiled ahead None" {
		t.Errorf("without a helper: the loop printed %q", got)
	}
	if got := run(src); got != "from the source None" { // a bare source, as agents before the payload sent it
		t.Errorf("bare source: %q", got)
	}
}

// TestBootstrapPayloadCopiesNothing: the payload goes out of the embedded files through one small buffer; built
// as one slice it was ~140 KB kept in every agent that starts an interpreter, plus ~140 KB of copies.
func TestBootstrapPayloadCopiesNothing(t *testing.T) {
	src := strings.Repeat("# the loop\n", 10000) // ~110 KB
	sum := sha256.Sum256([]byte(src))
	pyc := append(append([]byte{1, 2, 3, 4}, sum[:]...), bytes.Repeat([]byte{'c'}, 100000)...)
	helper := bytes.Repeat([]byte{'h'}, 12000)
	var out countingWriter
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	if err := writeBootstrapPayload(&out, src, bytes.NewReader(pyc), helper); err != nil {
		t.Fatal(err)
	}
	runtime.ReadMemStats(&after)
	if want := 8 + len(pyc) + 4 + len(helper) + len(src); out.n != want {
		t.Fatalf("wrote %d bytes, want %d (the compiled code and the helper included)", out.n, want)
	}
	if got := after.TotalAlloc - before.TotalAlloc; got > 16<<10 {
		t.Errorf("writing a %d-byte payload allocated %d bytes", out.n, got)
	}
}

// countingWriter counts what is written to it and keeps nothing; like the pipe (an os.File) it takes a string
// as it is.
type countingWriter struct{ n int }

func (w *countingWriter) Write(b []byte) (int, error)       { w.n += len(b); return len(b), nil }
func (w *countingWriter) WriteString(s string) (int, error) { w.n += len(s); return len(s), nil }
