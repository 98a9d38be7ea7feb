package main

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"flag"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ramify-dev/ramify/client"
)

const testKey = "rk_cli"

var testNow = time.Date(2026, 11, 22, 23, 0, 0, 0, time.UTC)

// testCLI runs verbs against a stub server built from mux.
type testCLI struct {
	*cli
	out, errOut *bytes.Buffer
}

func newTestCLI(t *testing.T, mux *http.ServeMux) *testCLI {
	t.Helper()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasPrefix(r.URL.Path, "/v1/") && r.Header.Get("Authorization") != "Bearer "+testKey {
			writeErr(w, 401, "invalid api key")
			return
		}
		mux.ServeHTTP(w, r)
	}))
	t.Cleanup(srv.Close)
	tc := &testCLI{out: &bytes.Buffer{}, errOut: &bytes.Buffer{}}
	tc.cli = &cli{c: client.New(srv.URL, testKey), stdout: tc.out, stderr: tc.errOut, stdin: strings.NewReader(""), now: func() time.Time { return testNow }}
	return tc
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func writeErr(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, map[string]string{"error": msg})
}

func sandboxes() []client.Sandbox {
	at := func(min int) time.Time { return testNow.Add(-time.Duration(min) * time.Minute) }
	return []client.Sandbox{
		{ID: "sbx_c", Status: "paused", IP: "10.0.0.4", Shape: "1vcpu-1024mib", CreatedAt: at(1), FamilyID: "fam_a", ParentID: "sbx_a"},
		{ID: "sbx_a", Status: "running", IP: "10.0.0.2", Shape: "1vcpu-1024mib", CreatedAt: at(180), FamilyID: "fam_a"},
		{ID: "sbx_b", Status: "running", IP: "10.0.0.3", Shape: "1vcpu-1024mib", CreatedAt: at(2), FamilyID: "fam_a", ParentID: "sbx_a"},
		{ID: "sbx_d", Status: "running", IP: "10.0.0.5", Shape: "2vcpu-4096mib", CreatedAt: at(0), FamilyID: "fam_a", ParentID: "sbx_b"},
		{ID: "sbx_x", Status: "error", Shape: "1vcpu-1024mib", CreatedAt: at(3 * 24 * 60), FamilyID: "fam_x"},
	}
}

func listHandler(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, 200, map[string]any{"sandboxes": sandboxes()})
}

func TestLsTable(t *testing.T) {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/sandboxes", func(w http.ResponseWriter, r *http.Request) {
		if q := r.URL.Query(); q.Get("status") != "" && q.Get("status") != "running" || q.Get("metadata.team") != "" && q.Get("metadata.team") != "x" {
			t.Errorf("query %v", q)
		}
		listHandler(w, r)
	})
	tc := newTestCLI(t, mux)
	if err := tc.ls(context.Background(), nil); err != nil {
		t.Fatal(err)
	}
	want := `ID     STATUS   IP        SHAPE          AGE  PARENT
sbx_x  error    -         1vcpu-1024mib  3d   -
sbx_a  running  10.0.0.2  1vcpu-1024mib  3h   -
sbx_b  running  10.0.0.3  1vcpu-1024mib  2m   sbx_a
sbx_c  paused   10.0.0.4  1vcpu-1024mib  1m   sbx_a
sbx_d  running  10.0.0.5  2vcpu-4096mib  0s   sbx_b
`
	if got := tc.out.String(); got != want {
		t.Errorf("table:\n%s\nwant:\n%s", got, want)
	}
	tc.out.Reset()
	if err := tc.ls(context.Background(), []string{"--status", "running", "--meta", "team=x", "--json"}); err != nil {
		t.Fatal(err)
	}
	var got []client.Sandbox
	if err := json.Unmarshal(tc.out.Bytes(), &got); err != nil || len(got) != 5 || got[0].ID != "sbx_x" {
		t.Errorf("json: %v %s", err, tc.out)
	}
}

func TestHumanAge(t *testing.T) {
	for d, want := range map[time.Duration]string{-time.Second: "0s", 59 * time.Second: "59s", 61 * time.Second: "1m",
		90 * time.Minute: "1h", 47 * time.Hour: "47h", 49 * time.Hour: "2d"} {
		if got := humanAge(d); got != want {
			t.Errorf("%v: %q want %q", d, got, want)
		}
	}
}

func TestDrawForest(t *testing.T) {
	sb := func(id, status, parent string, min int) client.Sandbox {
		return client.Sandbox{ID: id, Status: status, ParentID: parent, CreatedAt: testNow.Add(time.Duration(min) * time.Minute)}
	}
	cases := []struct {
		name string
		in   []client.Sandbox
		want string
	}{
		{"empty", nil, ""},
		{"one", []client.Sandbox{sb("sbx_a", "running", "", 0)}, "sbx_a (running)\n"},
		{"two children", []client.Sandbox{sb("sbx_c", "paused", "sbx_a", 2), sb("sbx_a", "running", "", 0), sb("sbx_b", "running", "sbx_a", 1)},
			"sbx_a (running)\n├── sbx_b (running)\n└── sbx_c (paused)\n"},
		{"grandchildren", []client.Sandbox{
			sb("sbx_a", "running", "", 0), sb("sbx_b", "running", "sbx_a", 1), sb("sbx_c", "paused", "sbx_a", 2),
			sb("sbx_d", "running", "sbx_b", 3), sb("sbx_e", "running", "sbx_b", 4), sb("sbx_f", "running", "sbx_c", 5), sb("sbx_g", "running", "sbx_e", 6)},
			"sbx_a (running)\n" +
				"├── sbx_b (running)\n" +
				"│   ├── sbx_d (running)\n" +
				"│   └── sbx_e (running)\n" +
				"│       └── sbx_g (running)\n" +
				"└── sbx_c (paused)\n" +
				"    └── sbx_f (running)\n"},
		{"orphans are roots", []client.Sandbox{sb("sbx_b", "running", "sbx_gone", 1), sb("sbx_c", "running", "sbx_b", 2), sb("sbx_z", "paused", "", 0)},
			"sbx_z (paused)\nsbx_b (running)\n└── sbx_c (running)\n"},
		{"same time sorted by id", []client.Sandbox{sb("sbx_2", "running", "sbx_0", 1), sb("sbx_1", "running", "sbx_0", 1), sb("sbx_0", "running", "", 0)},
			"sbx_0 (running)\n├── sbx_1 (running)\n└── sbx_2 (running)\n"},
		{"cycle does not hang", []client.Sandbox{sb("sbx_a", "running", "sbx_b", 0), sb("sbx_b", "running", "sbx_a", 1)},
			"sbx_a (running)\nsbx_b (running)\n"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			if got := drawForest(buildForest(tc.in)); got != tc.want {
				t.Errorf("got:\n%s\nwant:\n%s", got, tc.want)
			}
		})
	}
}

func TestTreeVerb(t *testing.T) {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/sandboxes", listHandler)
	tc := newTestCLI(t, mux)
	if err := tc.tree(context.Background(), []string{"sbx_d"}); err != nil {
		t.Fatal(err)
	}
	want := "sbx_a (running)\n├── sbx_b (running)\n│   └── sbx_d (running)\n└── sbx_c (paused)\n"
	if got := tc.out.String(); got != want {
		t.Errorf("got:\n%s\nwant:\n%s", got, want)
	}
	tc.out.Reset()
	if err := tc.tree(context.Background(), nil); err != nil {
		t.Fatal(err)
	}
	if got := tc.out.String(); got != "sbx_x (error)\n"+want {
		t.Errorf("all families:\n%s", got)
	}
	tc.out.Reset()
	if err := tc.tree(context.Background(), []string{"--json", "sbx_c"}); err != nil {
		t.Fatal(err)
	}
	var roots []treeNode
	if err := json.Unmarshal(tc.out.Bytes(), &roots); err != nil || len(roots) != 1 || len(roots[0].Children) != 2 || roots[0].Children[0].Children[0].ID != "sbx_d" {
		t.Errorf("json %v %s", err, tc.out)
	}
	err := tc.tree(context.Background(), []string{"sbx_nope"})
	if !errors.Is(err, client.ErrNotFound) {
		t.Errorf("unknown id: %v", err)
	}
}

func TestFormatDiff(t *testing.T) {
	cases := []struct {
		d    client.Diff
		want string
	}{
		{client.Diff{}, ""},
		{client.Diff{Added: []string{"/root/b.txt"}, Removed: []string{"/root/a.txt"}, Modified: []string{"/x", "/y"}},
			"+ /root/b.txt\n- /root/a.txt\nM /x\nM /y\n"},
		{client.Diff{Modified: []string{"/tmp/m"}}, "M /tmp/m\n"},
		// Names that are not UTF-8 text print quoted: no escape sequence reaches the terminal, no two alike.
		{client.Diff{Added: []string{"/caf\xe9", "/café", "/\x1b[31mred", "/a b"}},
			"+ \"/caf\\xe9\"\n+ /café\n+ \"/\\x1b[31mred\"\n+ /a b\n"},
	}
	for _, c := range cases {
		if got := formatDiff(&c.d); got != c.want {
			t.Errorf("%+v: %q want %q", c.d, got, c.want)
		}
	}
}

func TestWriteEntriesQuotesUnprintableNames(t *testing.T) {
	var b strings.Builder
	writeEntries(&b, []client.Entry{{Name: "\x1b]0;owned\x07", Type: "file"}, {Name: "ok.txt", Type: "symlink", LinkTarget: "t\xff"}})
	if out := b.String(); strings.ContainsAny(out, "\x1b\x07\xff") || !strings.Contains(out, `"\x1b]0;owned\a"`) ||
		!strings.Contains(out, `ok.txt -> "t\xff"`) {
		t.Fatalf("listing: %q", out)
	}
}

func TestDiffVerb(t *testing.T) {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/sandboxes/{id}/diff/{other}", func(w http.ResponseWriter, r *http.Request) {
		if got := r.URL.Query()["paths"]; !reflect.DeepEqual(got, []string{"/data", "/etc"}) {
			t.Errorf("paths %q", got)
		}
		if r.PathValue("id") != "a" || r.PathValue("other") != "b" {
			t.Errorf("ids %s %s", r.PathValue("id"), r.PathValue("other"))
		}
		writeJSON(w, 200, client.Diff{Added: []string{"/data/b.txt"}, Removed: []string{"/data/a.txt"}, Modified: []string{"/data/x"}})
	})
	tc := newTestCLI(t, mux)
	if err := tc.diff(context.Background(), []string{"a", "b", "--path", "/data", "--path", "/etc"}); err != nil {
		t.Fatal(err)
	}
	if got := tc.out.String(); got != "+ /data/b.txt\n- /data/a.txt\nM /data/x\n" {
		t.Errorf("%q", got)
	}
}

func TestParseArgs(t *testing.T) {
	fs := flag.NewFlagSet("x", flag.ContinueOnError)
	n := fs.Int("n", 1, "")
	j := fs.Bool("json", false, "")
	pos, rest, dd, err := parseArgs(fs, []string{"sbx_1", "-n", "5", "two", "--json", "--", "ls", "-l"})
	if err != nil || *n != 5 || !*j || !dd || !reflect.DeepEqual(pos, []string{"sbx_1", "two"}) || !reflect.DeepEqual(rest, []string{"ls", "-l"}) {
		t.Errorf("%v %v %v %v n=%d json=%v", pos, rest, dd, err, *n, *j)
	}
	pos, _, dd, err = parseArgs(fs, []string{"sbx_1", "-"})
	if err != nil || dd || !reflect.DeepEqual(pos, []string{"sbx_1", "-"}) {
		t.Errorf("%v %v %v", pos, dd, err)
	}
	fs.SetOutput(io.Discard)
	if _, _, _, err := parseArgs(fs, []string{"sbx_1", "--bogus"}); err == nil {
		t.Error("unknown flag accepted")
	}
}

func TestSandboxCreate(t *testing.T) {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/sandboxes", func(w http.ResponseWriter, r *http.Request) {
		var req map[string]any
		json.NewDecoder(r.Body).Decode(&req)
		want := map[string]any{"vcpu": 2.0, "mem_mib": 2048.0, "max_procs": 64.0, "timeout_s": 300.0, "env": map[string]any{"A": "1", "B": "x=y"},
			"cwd": "/work", "metadata": map[string]any{"team": "a"}}
		if !reflect.DeepEqual(req, want) {
			t.Errorf("body %v\nwant %v", req, want)
		}
		writeJSON(w, 201, client.Sandbox{ID: "sbx_new", Status: "running", IP: "10.0.0.9", Shape: "2vcpu-2048mib"})
	})
	tc := newTestCLI(t, mux)
	err := tc.sandboxCreate(context.Background(), []string{"--vcpu", "2", "--mem", "2G", "--max-procs", "64", "--timeout", "5m",
		"--env", "A=1", "--env", "B=x=y", "--cwd", "/work", "--meta", "team=a"})
	if err != nil {
		t.Fatal(err)
	}
	if tc.out.String() != "sbx_new\n" || !strings.Contains(tc.errOut.String(), "ramify run sbx_new 'print(1)'") {
		t.Errorf("out %q err %q", tc.out, tc.errOut)
	}
	if err := tc.sandboxCreate(context.Background(), []string{"--env", "novalue"}); err == nil {
		t.Error("--env without = accepted")
	}
}

func runCodeMux(t *testing.T) *http.ServeMux {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/sandboxes/{id}/run_code", func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			Code     string `json:"code"`
			Stream   bool   `json:"stream"`
			TimeoutS *int   `json:"timeout_s"`
		}
		json.NewDecoder(r.Body).Decode(&req)
		val := "'v'"
		res := map[string]any{"type": "result", "stdout": "partial", "stderr": "", "value": &val, "error": nil, "execution_count": 1}
		if req.Code == "boom" {
			res["value"] = nil
			res["error"] = client.ExecError{Name: "ZeroDivisionError", Value: "division by zero", Traceback: "Traceback (most recent call last):\n  File \"<cell>\", line 1\nZeroDivisionError: division by zero\n"}
		}
		if req.Code == "timeout" && (req.TimeoutS == nil || *req.TimeoutS != 7) {
			t.Errorf("timeout %v", req.TimeoutS)
		}
		if !req.Stream {
			delete(res, "type")
			writeJSON(w, 200, res)
			return
		}
		w.Header().Set("Content-Type", "application/x-ndjson")
		enc := json.NewEncoder(w)
		enc.Encode(map[string]string{"type": "stdout", "data": "code was: " + req.Code})
		enc.Encode(map[string]string{"type": "stderr", "data": "warning\n"})
		enc.Encode(res)
	})
	return mux
}

func TestRunVerb(t *testing.T) {
	tc := newTestCLI(t, runCodeMux(t))
	ctx := context.Background()
	if err := tc.run(ctx, []string{"sbx_1", "print(1)"}); err != nil {
		t.Fatal(err)
	}
	if got := tc.out.String(); got != "code was: print(1)\n'v'\n" {
		t.Errorf("stdout %q", got)
	}
	if got := tc.errOut.String(); got != "warning\n" {
		t.Errorf("stderr %q", got)
	}

	tc.out.Reset()
	tc.errOut.Reset()
	err := tc.run(ctx, []string{"sbx_1", "boom"})
	if es, ok := err.(exitStatus); !ok || es != 1 {
		t.Fatalf("want exit status 1, got %v", err)
	}
	if got := tc.errOut.String(); !strings.HasSuffix(got, "ZeroDivisionError: division by zero\n") || !strings.Contains(got, "Traceback") {
		t.Errorf("stderr %q", got)
	}

	tc.out.Reset()
	tc.stdin = strings.NewReader("from stdin")
	if err := tc.run(ctx, []string{"sbx_1", "-"}); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(tc.out.String(), "code was: from stdin\n") {
		t.Errorf("stdin: %q", tc.out)
	}

	tc.out.Reset()
	f := filepath.Join(t.TempDir(), "c.py")
	os.WriteFile(f, []byte("timeout"), 0o644)
	if err := tc.run(ctx, []string{"sbx_1", "-f", f, "--timeout", "7"}); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(tc.out.String(), "code was: timeout\n") {
		t.Errorf("file: %q", tc.out)
	}

	tc.out.Reset()
	err = tc.run(ctx, []string{"--json", "sbx_1", "boom"})
	var ex client.Execution
	if jerr := json.Unmarshal(tc.out.Bytes(), &ex); jerr != nil || ex.Error == nil || err != exitStatus(1) {
		t.Errorf("json: %v %v %s", err, jerr, tc.out)
	}

	if err := tc.run(ctx, []string{"sbx_1"}); err == nil {
		t.Error("run without code accepted")
	}
}

func TestExecVerb(t *testing.T) {
	var mu sync.Mutex
	var got []client.ExecRequest
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/sandboxes/{id}/exec", func(w http.ResponseWriter, r *http.Request) {
		var req client.ExecRequest
		json.NewDecoder(r.Body).Decode(&req)
		mu.Lock()
		got = append(got, req)
		mu.Unlock()
		w.Header().Set("Content-Type", "application/x-ndjson")
		io.WriteString(w, `{"type":"stdout","data":"out\n"}`+"\n"+`{"type":"stderr","data":"err\n"}`+"\n")
		code := 0
		if req.Cmd == "exit 3" {
			code = 3
		}
		json.NewEncoder(w).Encode(map[string]any{"type": "exit", "exit_code": code, "timed_out": req.Cmd == "sleep 9"})
	})
	tc := newTestCLI(t, mux)
	ctx := context.Background()
	if err := tc.exec(ctx, []string{"sbx_1", "--env", "A=b", "--cwd", "/tmp", "--", "ls", "-l", "/"}); err != nil {
		t.Fatal(err)
	}
	if tc.out.String() != "out\n" || tc.errOut.String() != "err\n" {
		t.Errorf("out %q err %q", tc.out, tc.errOut)
	}
	if err := tc.exec(ctx, []string{"sbx_1", "exit 3"}); err != exitStatus(3) {
		t.Errorf("exit code: %v", err)
	}
	if err := tc.exec(ctx, []string{"sbx_1", "sleep 9", "--timeout", "1"}); err != exitStatus(124) {
		t.Errorf("timeout: %v", err)
	}
	if err := tc.exec(ctx, []string{"sbx_1"}); err == nil {
		t.Error("exec without command accepted")
	}
	want := []client.ExecRequest{
		{Argv: []string{"ls", "-l", "/"}, Env: map[string]string{"A": "b"}, Cwd: "/tmp"},
		{Cmd: "exit 3"},
		{Cmd: "sleep 9", TimeoutS: client.Int(1)},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("requests %+v", got)
	}
}

func TestForkMergePause(t *testing.T) {
	var mu sync.Mutex
	status := "running"
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/sandboxes/{id}/fork", func(w http.ResponseWriter, r *http.Request) {
		var req struct{ N int }
		json.NewDecoder(r.Body).Decode(&req)
		if req.N != 3 {
			t.Errorf("n %d", req.N)
		}
		writeJSON(w, 200, map[string]any{"children": []string{"sbx_1", "sbx_2", "sbx_3"}})
	})
	mux.HandleFunc("POST /v1/sandboxes/{id}/merge_into/{winner}", func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(204)
	})
	polls := 0
	mux.HandleFunc("POST /v1/sandboxes/{id}/pause", func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		if status != "running" {
			writeErr(w, 409, "sandbox is not running")
			return
		}
		status = "pausing"
		w.Header().Set("X-Poll-After", "0.01")
		writeJSON(w, 202, map[string]string{"id": r.PathValue("id"), "status": status})
	})
	// The server's wait: answers once the pause is done.
	mux.HandleFunc("GET /v1/sandboxes/{id}/wait", func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		polls++
		if r.URL.Query().Get("status") == "paused" && status == "pausing" {
			status = "paused"
		}
		writeJSON(w, 200, map[string]string{"id": r.PathValue("id"), "status": status})
	})
	tc := newTestCLI(t, mux)
	ctx := context.Background()
	if err := tc.fork(ctx, []string{"sbx_p", "-n", "3"}); err != nil {
		t.Fatal(err)
	}
	if tc.out.String() != "sbx_1\nsbx_2\nsbx_3\n" {
		t.Errorf("fork %q", tc.out)
	}
	tc.out.Reset()
	if err := tc.merge(ctx, []string{"sbx_p", "sbx_2", "--json"}); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(tc.out.String(), `"merged": true`) {
		t.Errorf("merge %q", tc.out)
	}
	tc.out.Reset()
	if err := tc.pause(ctx, []string{"sbx_p"}); err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(tc.out.String(), "sbx_p paused (") || tc.errOut.String() != "pausing sbx_p ...\n" || polls != 1 {
		t.Errorf("pause out %q err %q polls %d", tc.out, tc.errOut, polls)
	}
	err := tc.pause(ctx, []string{"sbx_p"})
	if !errors.Is(err, client.ErrConflict) {
		t.Fatalf("second pause: %v", err)
	}
	if msg := tc.explain(err).Error(); !strings.HasPrefix(msg, "sandbox is not running\n  hint: ") {
		t.Errorf("explained %q", msg)
	}
}

func TestExplain(t *testing.T) {
	e := &cli{c: client.New("http://127.0.0.1:1", "")}
	msg := e.explain(&client.APIError{StatusCode: 401, Message: "invalid api key"}).Error()
	if !strings.Contains(msg, "RAMIFY_API_KEY is not set") {
		t.Errorf("%q", msg)
	}
	e.c = client.New("http://127.0.0.1:1", "k")
	msg = e.explain(&client.APIError{StatusCode: 401, Message: "invalid api key"}).Error()
	if msg != "invalid api key\n  hint: "+hintUnauthorized {
		t.Errorf("%q", msg)
	}
	_, err := e.c.List(context.Background(), client.ListOptions{})
	if msg := e.explain(err).Error(); !strings.Contains(msg, "connection refused") || !strings.Contains(msg, "ramify serve") {
		t.Errorf("%q", msg)
	}
	if msg := e.explain(&client.APIError{StatusCode: 404, Message: "sandbox not found"}).Error(); !strings.Contains(msg, "ramify ls") {
		t.Errorf("%q", msg)
	}
	if msg := e.explain(&client.APIError{StatusCode: 500, Message: "disk full"}).Error(); msg != "server error (HTTP 500): disk full" {
		t.Errorf("%q", msg)
	}
}

func TestSplitRemote(t *testing.T) {
	for in, want := range map[string][2]string{
		"sbx_1:/root/a": {"sbx_1", "/root/a"},
		"sbx_1:/":       {"sbx_1", "/"},
		"./a:b":         {},
		"a:b":           {},
		"/tmp/x:/y":     {},
		"file.txt":      {},
		":/x":           {},
	} {
		id, p, ok := splitRemote(in)
		if ok != (want[0] != "") || id != want[0] || p != want[1] {
			t.Errorf("%q: %q %q %v", in, id, p, ok)
		}
	}
}

// fileStub is an in-memory file system of one sandbox behind the file routes.
type fileStub struct {
	mu       sync.Mutex
	files    map[string][]byte
	modes    map[string]string
	dirs     map[string]bool
	archives map[string][]byte
}

func (f *fileStub) mux(t *testing.T) *http.ServeMux {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/sandboxes/{id}/files/stat", func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		defer f.mu.Unlock()
		p := r.URL.Query().Get("path")
		switch {
		case f.dirs[p]:
			writeJSON(w, 200, client.Entry{Path: p, Type: "dir", Mode: "0755"})
		case f.files[p] != nil:
			writeJSON(w, 200, client.Entry{Path: p, Type: "file", Mode: f.modes[p], Size: int64(len(f.files[p]))})
		default:
			writeErr(w, 404, "no such file or directory")
		}
	})
	mux.HandleFunc("PUT /v1/sandboxes/{id}/files", func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		f.mu.Lock()
		defer f.mu.Unlock()
		p := r.URL.Query().Get("path")
		f.files[p], f.modes[p] = b, r.URL.Query().Get("mode")
		writeJSON(w, 200, map[string]any{"path": p, "size": len(b)})
	})
	mux.HandleFunc("GET /v1/sandboxes/{id}/files", func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		defer f.mu.Unlock()
		b, ok := f.files[r.URL.Query().Get("path")]
		if !ok {
			writeErr(w, 404, "no such file")
			return
		}
		w.Write(b)
	})
	mux.HandleFunc("POST /v1/sandboxes/{id}/files/mkdir", func(w http.ResponseWriter, r *http.Request) {
		var req struct{ Path string }
		json.NewDecoder(r.Body).Decode(&req)
		f.mu.Lock()
		f.dirs[req.Path] = true
		f.mu.Unlock()
		writeJSON(w, 200, client.Entry{Path: req.Path, Type: "dir"})
	})
	mux.HandleFunc("PUT /v1/sandboxes/{id}/files/archive", func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		n := 0
		tr := tar.NewReader(bytes.NewReader(b))
		for {
			h, err := tr.Next()
			if err != nil {
				break
			}
			if h.Typeflag == tar.TypeReg {
				n++
			}
		}
		f.mu.Lock()
		p := r.URL.Query().Get("path")
		f.archives[p], f.dirs[p] = b, true
		f.mu.Unlock()
		writeJSON(w, 200, map[string]any{"path": p, "files": n})
	})
	mux.HandleFunc("GET /v1/sandboxes/{id}/files/archive", func(w http.ResponseWriter, r *http.Request) {
		f.mu.Lock()
		defer f.mu.Unlock()
		w.Header().Set("Content-Type", "application/x-tar")
		w.Write(f.archives[r.URL.Query().Get("path")])
	})
	return mux
}

func TestCpRoundTrip(t *testing.T) {
	fst := &fileStub{files: map[string][]byte{}, modes: map[string]string{}, dirs: map[string]bool{"/root": true}, archives: map[string][]byte{}}
	tc := newTestCLI(t, fst.mux(t))
	ctx := context.Background()
	src := t.TempDir()
	os.WriteFile(filepath.Join(src, "a.txt"), []byte("alpha"), 0o640)
	os.MkdirAll(filepath.Join(src, "sub", "deep"), 0o755)
	os.WriteFile(filepath.Join(src, "sub", "deep", "b.bin"), []byte{0, 1, 2}, 0o755)
	os.Symlink("a.txt", filepath.Join(src, "link"))

	// A file into an existing directory keeps its name and mode.
	if err := tc.cp(ctx, []string{filepath.Join(src, "a.txt"), "sbx_1:/root"}); err != nil {
		t.Fatal(err)
	}
	if string(fst.files["/root/a.txt"]) != "alpha" || fst.modes["/root/a.txt"] != "0640" {
		t.Errorf("file upload: %q %q", fst.files, fst.modes)
	}
	// A directory to a new path.
	if err := tc.cp(ctx, []string{src, "sbx_1:/root/proj"}); err != nil {
		t.Fatal(err)
	}
	if fst.archives["/root/proj"] == nil {
		t.Fatalf("no archive uploaded: %v", fst.archives)
	}
	if !strings.Contains(tc.errOut.String(), "(2 files)") {
		t.Errorf("summary %q", tc.errOut)
	}
	// And back.
	dst := t.TempDir()
	if err := tc.cp(ctx, []string{"sbx_1:/root/proj", filepath.Join(dst, "proj")}); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(filepath.Join(dst, "proj", "sub", "deep", "b.bin")); !bytes.Equal(b, []byte{0, 1, 2}) {
		t.Errorf("b.bin %v", b)
	}
	if fi, err := os.Stat(filepath.Join(dst, "proj", "sub", "deep", "b.bin")); err != nil || fi.Mode().Perm() != 0o755 {
		t.Errorf("b.bin mode %v %v", fi, err)
	}
	if l, err := os.Readlink(filepath.Join(dst, "proj", "link")); err != nil || l != "a.txt" {
		t.Errorf("link %q %v", l, err)
	}
	// A file into an existing local directory.
	if err := tc.cp(ctx, []string{"sbx_1:/root/a.txt", dst}); err != nil {
		t.Fatal(err)
	}
	if b, _ := os.ReadFile(filepath.Join(dst, "a.txt")); string(b) != "alpha" {
		t.Errorf("a.txt %q", b)
	}
	// To stdout.
	tc.out.Reset()
	if err := tc.cp(ctx, []string{"sbx_1:/root/a.txt", "-"}); err != nil || tc.out.String() != "alpha" {
		t.Errorf("stdout %q %v", tc.out, err)
	}
	if err := tc.cp(ctx, []string{"sbx_1:/root/missing", dst}); !errors.Is(err, client.ErrNotFound) {
		t.Errorf("missing: %v", err)
	}
	if err := tc.cp(ctx, []string{"a", "b"}); err == nil {
		t.Error("local to local accepted")
	}
}

func TestExtractTarStaysInside(t *testing.T) {
	build := func(entries ...*tar.Header) []byte {
		var buf bytes.Buffer
		tw := tar.NewWriter(&buf)
		for _, h := range entries {
			if h.Typeflag == tar.TypeReg {
				h.Size = 1
			}
			tw.WriteHeader(h)
			if h.Typeflag == tar.TypeReg {
				tw.Write([]byte("x"))
			}
		}
		tw.Close()
		return buf.Bytes()
	}
	outside := t.TempDir()
	cases := map[string][]byte{
		"dotdot":  build(&tar.Header{Name: "../evil", Typeflag: tar.TypeReg, Mode: 0o644}),
		"symlink": build(&tar.Header{Name: "l", Typeflag: tar.TypeSymlink, Linkname: outside}, &tar.Header{Name: "l/evil", Typeflag: tar.TypeReg, Mode: 0o644}),
	}
	for name, data := range cases {
		dir := t.TempDir()
		if _, err := extractTar(bytes.NewReader(data), dir); err == nil {
			t.Errorf("%s: no error", name)
		}
		if _, err := os.Stat(filepath.Join(outside, "evil")); err == nil {
			t.Fatalf("%s: wrote outside the destination", name)
		}
		if _, err := os.Stat(filepath.Join(filepath.Dir(dir), "evil")); err == nil {
			t.Fatalf("%s: wrote outside the destination", name)
		}
	}
}

func TestFilesLs(t *testing.T) {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/sandboxes/{id}/files/list", func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("path") != "/root" {
			t.Errorf("path %q", r.URL.Query().Get("path"))
		}
		mt := time.Date(2026, 1, 2, 3, 4, 0, 0, time.Local)
		writeJSON(w, 200, map[string]any{"entries": []client.Entry{
			{Name: "a.txt", Type: "file", Size: 12, Mode: "0644", Mtime: mt},
			{Name: "d", Type: "dir", Size: 4096, Mode: "0755", Mtime: mt},
			{Name: "l", Type: "symlink", Size: 5, Mode: "0777", Mtime: mt, LinkTarget: "a.txt"},
		}})
	})
	tc := newTestCLI(t, mux)
	if err := tc.filesLs(context.Background(), []string{"sbx_1"}); err != nil {
		t.Fatal(err)
	}
	want := "-rw-r--r--    12  2026-01-02 03:04  a.txt\n" +
		"drwxr-xr-x  4096  2026-01-02 03:04  d/\n" +
		"lrwxrwxrwx     5  2026-01-02 03:04  l -> a.txt\n"
	if got := tc.out.String(); got != want {
		t.Errorf("got:\n%s\nwant:\n%s", got, want)
	}
}

func TestRm(t *testing.T) {
	mux := http.NewServeMux()
	mux.HandleFunc("DELETE /v1/sandboxes/{id}", func(w http.ResponseWriter, r *http.Request) {
		if r.PathValue("id") == "sbx_gone" {
			writeErr(w, 404, "sandbox not found")
			return
		}
		w.WriteHeader(204)
	})
	tc := newTestCLI(t, mux)
	err := tc.rm(context.Background(), []string{"sbx_1", "sbx_gone", "sbx_2"})
	if err != exitStatus(1) || tc.out.String() != "sbx_1\nsbx_2\n" || !strings.Contains(tc.errOut.String(), "sbx_gone: sandbox not found") {
		t.Errorf("%v out %q err %q", err, tc.out, tc.errOut)
	}
}

func TestGetVerb(t *testing.T) {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/sandboxes/{id}", func(w http.ResponseWriter, r *http.Request) {
		sb := sandboxes()[2]
		sb.VCPU, sb.MemMiB, sb.MaxProcs, sb.Cwd, sb.Hostname = 1, 1024, 512, "/root", "sbx-b"
		sb.Metadata = map[string]string{"team": "a", "run": "7"}
		writeJSON(w, 200, sb)
	})
	tc := newTestCLI(t, mux)
	if err := tc.get(context.Background(), []string{"sbx_b"}); err != nil {
		t.Fatal(err)
	}
	out := tc.out.String()
	for _, want := range []string{"id:       sbx_b\n", "status:   running\n", "shape:    1vcpu-1024mib (1 vcpu, 1024 MiB, 512 procs)\n",
		"parent:   sbx_a\n", "family:   fam_a\n", "metadata: run=7 team=a\n", "timeout:  none\n", "(2m ago)"} {
		if !strings.Contains(out, want) {
			t.Errorf("missing %q in:\n%s", want, out)
		}
	}
}

func TestWantsJSON(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want bool
	}{
		{[]string{"sbx_1", "--json"}, true},
		{[]string{"-json", "sbx_1"}, true},
		{[]string{"sbx_1", "--json=true"}, true},
		{[]string{"sbx_1"}, false},
		{[]string{"sbx_1", "--", "jq", "--json"}, false}, // the command's own flag
		{[]string{"sbx_1", "--json=false"}, false},
	} {
		if got := wantsJSON(tc.args); got != tc.want {
			t.Errorf("wantsJSON(%q) = %v, want %v", tc.args, got, tc.want)
		}
	}
}

// TestExplainLocalFile: a missing local file is the user's file, not an unreachable server (the errno inside a
// *fs.PathError also satisfies net.Error).
func TestExplainLocalFile(t *testing.T) {
	e := &cli{c: client.New("http://127.0.0.1:1", "k")}
	_, err := os.Stat(filepath.Join(t.TempDir(), "missing"))
	msg := e.explain(err).Error()
	if !strings.HasPrefix(msg, "local file ") || !strings.Contains(msg, "no such file") || strings.Contains(msg, "server") {
		t.Errorf("%q", msg)
	}
}

// TestJSONErrors: under --json a failing verb writes {"error", "hint"} to stdout and exits 1; without it the
// explained error is returned for main to print.
func TestJSONErrors(t *testing.T) {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/sandboxes/{id}", func(w http.ResponseWriter, r *http.Request) {
		writeErr(w, 404, "sandbox not found")
	})
	tc := newTestCLI(t, mux)
	t.Setenv("RAMIFY_API_URL", tc.c.BaseURL())
	t.Setenv("RAMIFY_API_KEY", testKey)
	err := tc.runVerb(context.Background(), (*cli).get, []string{"sbx_gone", "--json"})
	var es exitStatus
	if !errors.As(err, &es) || es != 1 {
		t.Fatalf("err %v, want exit status 1", err)
	}
	var got map[string]string
	if err := json.Unmarshal(tc.out.Bytes(), &got); err != nil || got["error"] != "sandbox not found" || got["hint"] != hintNotFound {
		t.Fatalf("stdout %q: %v", tc.out, err)
	}
	tc.out.Reset()
	err = tc.runVerb(context.Background(), (*cli).get, []string{"sbx_gone"})
	if err == nil || !strings.Contains(err.Error(), "sandbox not found\n  hint: ") || tc.out.Len() != 0 {
		t.Fatalf("err %v, stdout %q", err, tc.out)
	}
}

func TestResolve(t *testing.T) {
	for _, tc := range []struct {
		args []string
		name string
		rest []string
		ok   bool
	}{
		{[]string{"sandbox", "create", "--json"}, "sandbox create", []string{"--json"}, true},
		{[]string{"image", "build", "-h"}, "image build", []string{"-h"}, true},
		{[]string{"run", "sbx_1", "x"}, "run", []string{"sbx_1", "x"}, true},
		{[]string{"bogus"}, "bogus", []string{}, false},
	} {
		name, rest, ok := resolve(tc.args)
		if name != tc.name || ok != tc.ok || ok && !reflect.DeepEqual(rest, tc.rest) {
			t.Errorf("resolve(%q) = %q %q %v", tc.args, name, rest, ok)
		}
	}
}

func TestNamedBuildAndReadList(t *testing.T) {
	for _, tc := range []struct {
		args []string
		want bool
	}{
		{[]string{"--name", "x"}, true}, {[]string{"--apt", "tree", "--name=x"}, true}, {[]string{"-name", "x"}, true},
		{[]string{"--force"}, false}, {[]string{"--", "--name"}, false}, {nil, false},
	} {
		if got := namedBuild(tc.args); got != tc.want {
			t.Errorf("namedBuild(%q) = %v", tc.args, got)
		}
	}
	p := filepath.Join(t.TempDir(), "reqs")
	os.WriteFile(p, []byte("# comment\n\nnumpy==1.26  # pinned\n  attrs\n"), 0o644)
	got, err := readList(p)
	if err != nil || !reflect.DeepEqual(got, []string{"numpy==1.26", "attrs"}) {
		t.Errorf("readList: %q, %v", got, err)
	}
}

func TestProgressLine(t *testing.T) {
	for _, c := range []struct {
		p    client.Progress
		want string
	}{
		{client.Progress{Phase: "session", Bytes: 412 << 20}, "session: 412.0 MiB"},
		{client.Progress{Phase: "files", Bytes: 12 << 20, TotalBytes: 1 << 30}, "files: 12.0 MiB of 1.0 GiB (1%)"},
		{client.Progress{Phase: "commit", Bytes: 100}, "commit: 100 B"},
	} {
		if got := progressLine(&c.p); got != c.want {
			t.Errorf("%+v: %q, want %q", c.p, got, c.want)
		}
	}
}
