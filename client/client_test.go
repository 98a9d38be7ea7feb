package client

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"reflect"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/ramify-dev/ramify/internal/errdefs"
)

const testKey = "rk_test"

// stub is an httptest server whose routes are "METHOD /path" patterns of net/http. Every request under /v1
// must carry the test key.
type stub struct {
	t      *testing.T
	mux    *http.ServeMux
	srv    *httptest.Server
	opened atomic.Int32 // connections the server accepted
}

func newStub(t *testing.T) (*stub, *Client) {
	t.Helper()
	s := &stub{t: t, mux: http.NewServeMux()}
	s.srv = httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if strings.HasPrefix(r.URL.Path, "/v1/") && r.Header.Get("Authorization") != "Bearer "+testKey {
			writeErr(w, 401, "invalid api key")
			return
		}
		s.mux.ServeHTTP(w, r)
	}))
	s.srv.Config.ConnState = func(_ net.Conn, st http.ConnState) {
		if st == http.StateNew {
			s.opened.Add(1)
		}
	}
	s.srv.Start()
	t.Cleanup(s.srv.Close)
	return s, New(s.srv.URL+"/", testKey)
}

func (s *stub) handle(pattern string, h http.HandlerFunc) { s.mux.HandleFunc(pattern, h) }

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func writeErr(w http.ResponseWriter, status int, msg string) {
	writeJSON(w, status, map[string]string{"error": msg})
}

// decodeStrict decodes a request body, failing the test on unknown fields.
func decodeStrict(t *testing.T, r *http.Request, v any) {
	t.Helper()
	dec := json.NewDecoder(r.Body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		t.Errorf("decode request body: %v", err)
	}
}

const sbJSON = `{"id":"sbx_1","status":"running","ip":"10.213.0.5","hostname":"sbx-1","vcpu":0.5,"mem_mib":512,
"max_procs":512,"shape":"0.5vcpu-512mib","timeout_s":0,"on_timeout":"destroy","expires_at":null,"cwd":"/root",
"metadata":{"k":"v"},"created_at":"2026-11-22T22:30:00.123Z","family_id":"fam_1","parent_id":null,"forked_from":null,"error":""}`

func TestCreateGetListDelete(t *testing.T) {
	s, c := newStub(t)
	ctx := context.Background()
	s.handle("POST /v1/sandboxes", func(w http.ResponseWriter, r *http.Request) {
		if ct := r.Header.Get("Content-Type"); ct != "application/json" {
			t.Errorf("content type %q", ct)
		}
		var req map[string]any
		decodeStrict(t, r, &req)
		want := map[string]any{"vcpu": 0.5, "mem_mib": float64(512), "env": map[string]any{"A": "1"}, "metadata": map[string]any{"k": "v"}}
		if !reflect.DeepEqual(req, want) {
			t.Errorf("create body %v, want %v", req, want)
		}
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(201)
		io.WriteString(w, sbJSON)
	})
	s.handle("GET /v1/sandboxes/{id}", func(w http.ResponseWriter, r *http.Request) {
		if r.PathValue("id") != "sbx_1" {
			writeErr(w, 404, "sandbox not found")
			return
		}
		io.WriteString(w, sbJSON)
	})
	s.handle("GET /v1/sandboxes", func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		if q.Get("status") != "running" || q.Get("metadata.team") != "a b" || len(q) != 2 {
			t.Errorf("list query %v", q)
		}
		io.WriteString(w, `{"sandboxes":[`+sbJSON+`]}`)
	})
	var deletes atomic.Int32
	s.handle("DELETE /v1/sandboxes/{id}", func(w http.ResponseWriter, r *http.Request) {
		if deletes.Add(1) > 1 {
			writeErr(w, 404, "sandbox not found")
			return
		}
		w.WriteHeader(204)
	})

	sb, err := c.Create(ctx, CreateRequest{VCPU: 0.5, MemMiB: 512, Env: map[string]string{"A": "1"}, Metadata: map[string]string{"k": "v"}})
	if err != nil {
		t.Fatal(err)
	}
	wantCreated := time.Date(2026, 11, 22, 22, 30, 0, 123e6, time.UTC)
	if sb.ID != "sbx_1" || sb.Status != StatusRunning || sb.VCPU != 0.5 || !sb.CreatedAt.Equal(wantCreated) || sb.ParentID != "" || sb.FamilyID != "fam_1" || sb.Metadata["k"] != "v" {
		t.Errorf("created %+v", sb)
	}
	if _, err := c.Get(ctx, "sbx_1"); err != nil {
		t.Fatal(err)
	}
	_, err = c.Get(ctx, "sbx_nope")
	if !errors.Is(err, ErrNotFound) || !errors.Is(err, errdefs.ErrNotFound) || errors.Is(err, ErrConflict) {
		t.Fatalf("get unknown: %v", err)
	}
	var ae *APIError
	if !errors.As(err, &ae) || ae.StatusCode != 404 || ae.Message != "sandbox not found" || ae.Error() != "sandbox not found (HTTP 404)" {
		t.Errorf("api error %#v", ae)
	}
	list, err := c.List(ctx, ListOptions{Status: "running", Metadata: map[string]string{"team": "a b"}})
	if err != nil || len(list) != 1 || list[0].ID != "sbx_1" {
		t.Fatalf("list %v %v", list, err)
	}
	if err := c.Delete(ctx, "sbx_1"); err != nil {
		t.Fatal(err)
	}
	if err := c.Delete(ctx, "sbx_1"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("second delete: %v", err)
	}
}

func TestErrorMapping(t *testing.T) {
	s, c := newStub(t)
	s.handle("GET /v1/sandboxes/{id}", func(w http.ResponseWriter, r *http.Request) {
		switch id := r.PathValue("id"); id {
		case "plain":
			w.WriteHeader(502)
			io.WriteString(w, "bad gateway from proxy\n")
		case "empty":
			w.WriteHeader(500)
		default:
			var code int
			fmt.Sscan(id, &code)
			writeErr(w, code, "msg "+id)
		}
	})
	cases := []struct {
		id      string
		is      []error
		isNot   []error
		message string
	}{
		{"400", []error{ErrInvalid}, []error{ErrTooLarge, ErrNotFound}, "msg 400"},
		{"413", []error{ErrInvalid, ErrTooLarge}, []error{ErrConflict}, "msg 413"},
		{"409", []error{ErrConflict}, []error{ErrInvalid}, "msg 409"},
		{"401", []error{ErrUnauthorized}, nil, "msg 401"},
		{"404", []error{ErrNotFound}, nil, "msg 404"},
		{"500", nil, []error{ErrNotFound, ErrInvalid, ErrConflict, ErrUnauthorized}, "msg 500"},
		{"plain", nil, []error{ErrInvalid}, "bad gateway from proxy"},
		{"empty", nil, nil, "internal server error"},
	}
	for _, tc := range cases {
		_, err := c.Get(context.Background(), tc.id)
		var ae *APIError
		if !errors.As(err, &ae) {
			t.Fatalf("%s: %v is not an APIError", tc.id, err)
		}
		if ae.Message != tc.message {
			t.Errorf("%s: message %q, want %q", tc.id, ae.Message, tc.message)
		}
		for _, e := range tc.is {
			if !errors.Is(err, e) {
				t.Errorf("%s: not %v", tc.id, e)
			}
		}
		for _, e := range tc.isNot {
			if errors.Is(err, e) {
				t.Errorf("%s: unexpectedly %v", tc.id, e)
			}
		}
	}
}

func TestAuthHeader(t *testing.T) {
	s, _ := newStub(t)
	s.handle("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, `{"status":"ok","version":"v0.1"}`)
	})
	s.handle("GET /v1/sandboxes", func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, `{"sandboxes":[]}`) })
	bad := New(s.srv.URL, "wrong")
	_, err := bad.List(context.Background(), ListOptions{})
	if !errors.Is(err, ErrUnauthorized) || !strings.Contains(err.Error(), "invalid api key") {
		t.Fatalf("wrong key: %v", err)
	}
	h, err := bad.Health(context.Background())
	if err != nil || h.Status != "ok" || h.Version != "v0.1" {
		t.Fatalf("health %+v %v", h, err)
	}
	ok := New(s.srv.URL, testKey)
	list, err := ok.List(context.Background(), ListOptions{})
	if err != nil || list == nil || len(list) != 0 {
		t.Fatalf("list %v %v", list, err)
	}
}

func TestConnectionRefused(t *testing.T) {
	srv := httptest.NewServer(http.NotFoundHandler())
	url := srv.URL
	srv.Close()
	_, err := New(url, testKey).List(context.Background(), ListOptions{})
	if !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("want ECONNREFUSED, got %v", err)
	}
}

func TestRetriesWithIdempotencyKey(t *testing.T) {
	defer func(d time.Duration) { RetryBaseDelay = d }(RetryBaseDelay)
	RetryBaseDelay = time.Millisecond
	var mu sync.Mutex
	var keys []string
	hangUp := func(n int) bool { return n == 1 } // the server took the call, then the connection broke
	seen := func() []string { mu.Lock(); defer mu.Unlock(); return append([]string(nil), keys...) }
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body) //nolint:errcheck
		mu.Lock()
		keys = append(keys, r.Header.Get("Idempotency-Key"))
		cut := hangUp(len(keys))
		mu.Unlock()
		if cut {
			conn, _, _ := w.(http.Hijacker).Hijack()
			conn.Close()
			return
		}
		w.Header().Set("Content-Type", "application/json")
		io.WriteString(w, `{"children": ["sbx_c1"]}`) //nolint:errcheck
	}))
	defer srv.Close()
	c := New(srv.URL, testKey)
	kids, err := c.Fork(context.Background(), "sbx_p", 1)
	if k := seen(); err != nil || len(kids) != 1 || len(k) != 2 || k[0] == "" || k[0] != k[1] {
		t.Fatalf("fork whose first answer was lost: %v %v; keys %q (the retry must carry the first try's)", kids, err, k)
	}
	// Every call its own key.
	c.Fork(context.Background(), "sbx_p", 1) //nolint:errcheck
	if k := seen(); len(k) != 3 || k[2] == k[0] {
		t.Fatalf("a new call's key: %q", k)
	}
	// An upload (a streamed body) is not sent twice.
	mu.Lock()
	keys, hangUp = nil, func(int) bool { return true }
	mu.Unlock()
	if _, err := c.WriteFile(context.Background(), "sbx_p", "/x", strings.NewReader("data"), 0o644); err == nil {
		t.Fatal("write to a server that hangs up: no error")
	}
	if k := seen(); len(k) != 1 {
		t.Fatalf("an upload was sent %d times", len(k))
	}
}

func TestFromEnv(t *testing.T) {
	t.Setenv("RAMIFY_API_URL", "")
	t.Setenv("RAMIFY_API_KEY", "k1")
	c, err := FromEnv()
	if err != nil || c.BaseURL() != DefaultURL || c.apiKey != "k1" {
		t.Fatalf("%v %v", c, err)
	}
	t.Setenv("RAMIFY_API_URL", "https://ramify.example:8443/")
	c, err = FromEnv(WithHTTPClient(&http.Client{Timeout: time.Second}))
	if err != nil || c.BaseURL() != "https://ramify.example:8443" || c.hc.Timeout != time.Second {
		t.Fatalf("%v %v", c, err)
	}
}

// TestParseURL: RAMIFY_API_URL as users write it; without a scheme it is http://, and what cannot be a server
// address says what is wanted.
func TestParseURL(t *testing.T) {
	for _, tc := range []struct{ in, want, err string }{
		{"", DefaultURL, ""},
		{"http://127.0.0.1:7070", "http://127.0.0.1:7070", ""},
		{"https://ramify.example/", "https://ramify.example", ""},
		{"127.0.0.1:7070", "http://127.0.0.1:7070", ""},
		{"localhost:7070", "http://localhost:7070", ""},
		{" ramify.internal:80/ ", "http://ramify.internal:80", ""},
		{"ftp://host", "", "want http(s)://host[:port]"},
		{"http://", "", "want http(s)://host[:port]"},
		{"http://a b", "", "want http(s)://host[:port]"},
	} {
		got, err := ParseURL(tc.in)
		if tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("ParseURL(%q) = %q, %v; want an error containing %q", tc.in, got, err, tc.err)
			}
			continue
		}
		if err != nil || got != tc.want {
			t.Errorf("ParseURL(%q) = %q, %v; want %q", tc.in, got, err, tc.want)
		}
	}
}

func TestRunCode(t *testing.T) {
	s, c := newStub(t)
	s.handle("POST /v1/sandboxes/{id}/run_code", func(w http.ResponseWriter, r *http.Request) {
		var req map[string]any
		decodeStrict(t, r, &req)
		if !reflect.DeepEqual(req, map[string]any{"code": "1/0", "timeout_s": float64(0)}) {
			t.Errorf("body %v", req)
		}
		io.WriteString(w, `{"stdout":"hi\n","stderr":"","value":null,"error":{"name":"ZeroDivisionError","value":"division by zero","traceback":"Traceback..."},"execution_count":3}`)
	})
	ex, err := c.RunCode(context.Background(), "sbx_1", RunCodeRequest{Code: "1/0", TimeoutS: Int(0)})
	if err != nil {
		t.Fatal(err)
	}
	if ex.Stdout != "hi\n" || ex.Value != nil || ex.Error == nil || ex.Error.Name != "ZeroDivisionError" || ex.ExecutionCount != 3 {
		t.Errorf("%+v", ex)
	}
	if ex.Error.Error() != "ZeroDivisionError: division by zero" {
		t.Errorf("exec error text %q", ex.Error.Error())
	}
}

func TestRunCodeStream(t *testing.T) {
	s, c := newStub(t)
	release := make(chan struct{})
	s.handle("POST /v1/sandboxes/{id}/run_code", func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			Code   string `json:"code"`
			Stream bool   `json:"stream"`
		}
		decodeStrict(t, r, &req)
		if !req.Stream || r.Header.Get("Accept") != "application/x-ndjson" {
			t.Errorf("not a stream request: %+v %q", req, r.Header.Get("Accept"))
		}
		w.Header().Set("Content-Type", "application/x-ndjson")
		switch req.Code {
		case "truncated":
			io.WriteString(w, `{"type":"stdout","data":"a"}`+"\n")
			return
		case "broken":
			io.WriteString(w, `{"type":"error","error":"interpreter vanished"}`+"\n")
			return
		}
		io.WriteString(w, `{"type":"stdout","data":"one\n"}`+"\n")
		w.(http.Flusher).Flush()
		<-release // the first event must reach the client before the rest is written
		io.WriteString(w, `{"type":"stderr","data":"warn\n"}`+"\n"+`{"type":"stdout","data":"two\n"}`+"\n")
		io.WriteString(w, `{"type":"result","stdout":"one\ntwo\n","stderr":"warn\n","value":"42","error":null,"execution_count":1}`+"\n")
	})
	var events []Event
	ex, err := c.RunCodeStream(context.Background(), "sbx_1", RunCodeRequest{Code: "x"}, func(e Event) {
		if len(events) == 0 {
			close(release)
		}
		events = append(events, Event{Type: e.Type, Data: e.Data})
	})
	if err != nil {
		t.Fatal(err)
	}
	want := []Event{{Type: "stdout", Data: "one\n"}, {Type: "stderr", Data: "warn\n"}, {Type: "stdout", Data: "two\n"}}
	if !reflect.DeepEqual(events, want) {
		t.Errorf("events %v", events)
	}
	if ex.Value == nil || *ex.Value != "42" || ex.Error != nil || ex.ExecutionCount != 1 {
		t.Errorf("result %+v", ex)
	}
	_, err = c.RunCodeStream(context.Background(), "sbx_1", RunCodeRequest{Code: "truncated"}, nil)
	if !errors.Is(err, io.ErrUnexpectedEOF) {
		t.Errorf("truncated stream: %v", err)
	}
	_, err = c.RunCodeStream(context.Background(), "sbx_1", RunCodeRequest{Code: "broken"}, nil)
	if err == nil || !strings.Contains(err.Error(), "interpreter vanished") {
		t.Errorf("error event: %v", err)
	}
}

func TestStreamFallbackToPlainJSON(t *testing.T) {
	s, c := newStub(t)
	s.handle("POST /v1/sandboxes/{id}/exec", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, 200, ExecResult{ExitCode: 3, Stdout: "out", Stderr: "err"})
	})
	var got []string
	res, err := c.ExecStream(context.Background(), "sbx_1", ExecRequest{Cmd: "x"}, func(e Event) { got = append(got, e.Type+":"+e.Data) })
	if err != nil || res.ExitCode != 3 || res.Stdout != "" {
		t.Fatalf("%+v %v", res, err)
	}
	if !reflect.DeepEqual(got, []string{"stdout:out", "stderr:err"}) {
		t.Errorf("events %v", got)
	}
}

func TestExec(t *testing.T) {
	s, c := newStub(t)
	s.handle("POST /v1/sandboxes/{id}/exec", func(w http.ResponseWriter, r *http.Request) {
		var req struct {
			ExecRequest
			Stream bool `json:"stream"`
		}
		decodeStrict(t, r, &req)
		if !reflect.DeepEqual(req.Argv, []string{"ls", "-l"}) || req.Env["A"] != "b" || req.Cwd != "/tmp" || *req.TimeoutS != 5 || req.Stdin != "in" {
			t.Errorf("exec body %+v", req)
		}
		if !req.Stream {
			writeJSON(w, 200, map[string]any{"exit_code": 137, "stdout": "x", "stderr": "", "timed_out": true})
			return
		}
		w.Header().Set("Content-Type", "application/x-ndjson")
		io.WriteString(w, `{"type":"stdout","data":"x"}`+"\n"+`{"type":"exit","exit_code":2,"timed_out":false}`+"\n")
	})
	req := ExecRequest{Argv: []string{"ls", "-l"}, Env: map[string]string{"A": "b"}, Cwd: "/tmp", TimeoutS: Int(5), Stdin: "in"}
	res, err := c.Exec(context.Background(), "sbx_1", req)
	if err != nil || res.ExitCode != 137 || !res.TimedOut || res.Stdout != "x" {
		t.Fatalf("%+v %v", res, err)
	}
	var out bytes.Buffer
	res, err = c.ExecStream(context.Background(), "sbx_1", req, func(e Event) { out.WriteString(e.Data) })
	if err != nil || res.ExitCode != 2 || res.TimedOut || out.String() != "x" {
		t.Fatalf("%+v %v %q", res, err, out.String())
	}
	if _, err := c.Exec(context.Background(), "sbx_1", ExecRequest{}); !errors.Is(err, ErrInvalid) {
		t.Errorf("empty exec: %v", err)
	}
}

func TestFiles(t *testing.T) {
	s, c := newStub(t)
	ctx := context.Background()
	s.handle("GET /v1/sandboxes/{id}/files", func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Query().Get("path") {
		case "/root/a.txt":
			w.Header().Set("Content-Type", "application/octet-stream")
			io.WriteString(w, "hello")
		case "/root":
			writeErr(w, 400, "is a directory")
		default:
			writeErr(w, 404, "no such file")
		}
	})
	s.handle("DELETE /v1/sandboxes/{id}/files", func(w http.ResponseWriter, r *http.Request) {
		if q := r.URL.Query(); q.Get("path") != "/root/d" || q.Get("recursive") != "true" {
			t.Errorf("delete query %v", q)
		}
		w.WriteHeader(204)
	})
	s.handle("GET /v1/sandboxes/{id}/files/list", func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, `{"entries":[{"name":"a.txt","path":"/root/a.txt","type":"file","size":5,"mode":"0644","mtime":"2026-11-22T22:30:00Z","link_target":""}]}`)
	})
	s.handle("GET /v1/sandboxes/{id}/files/stat", func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, `{"name":"root","path":"/root","type":"dir","size":4096,"mode":"0700","mtime":"2026-11-22T22:30:00Z"}`)
	})
	s.handle("POST /v1/sandboxes/{id}/files/mkdir", func(w http.ResponseWriter, r *http.Request) {
		var req map[string]any
		decodeStrict(t, r, &req)
		if !reflect.DeepEqual(req, map[string]any{"path": "/root/x/y", "parents": true}) {
			t.Errorf("mkdir body %v", req)
		}
		io.WriteString(w, `{"name":"y","path":"/root/x/y","type":"dir","mode":"0755"}`)
	})

	rc, err := c.ReadFile(ctx, "sbx_1", "/root/a.txt")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(rc)
	rc.Close()
	if string(b) != "hello" {
		t.Errorf("read %q", b)
	}
	if _, err := c.ReadFile(ctx, "sbx_1", "/root/missing"); !errors.Is(err, ErrNotFound) {
		t.Errorf("missing: %v", err)
	}
	if _, err := c.ReadFile(ctx, "sbx_1", "/root"); !errors.Is(err, ErrInvalid) {
		t.Errorf("dir: %v", err)
	}
	ents, err := c.ListFiles(ctx, "sbx_1", "/root")
	if err != nil || len(ents) != 1 || ents[0].Size != 5 || ents[0].Mode != "0644" || ents[0].IsDir() {
		t.Fatalf("%+v %v", ents, err)
	}
	st, err := c.Stat(ctx, "sbx_1", "/root")
	if err != nil || !st.IsDir() {
		t.Fatalf("%+v %v", st, err)
	}
	if e, err := c.Mkdir(ctx, "sbx_1", "/root/x/y", true); err != nil || e.Path != "/root/x/y" {
		t.Fatalf("%+v %v", e, err)
	}
	if err := c.RemoveFile(ctx, "sbx_1", "/root/d", true); err != nil {
		t.Fatal(err)
	}
}

// TestWriteFileStreams checks that WriteFile sends the body as it reads it: the reader only produces its second
// half after the server has received the first, which deadlocks a client that buffers.
func TestWriteFileStreams(t *testing.T) {
	s, c := newStub(t)
	gotFirst := make(chan struct{})
	s.handle("PUT /v1/sandboxes/{id}/files", func(w http.ResponseWriter, r *http.Request) {
		q := r.URL.Query()
		if q.Get("path") != "/root/big" || q.Get("mode") != "0755" || r.Header.Get("Content-Type") != "application/octet-stream" {
			t.Errorf("put query %v", q)
		}
		buf := make([]byte, 1<<20)
		if _, err := io.ReadFull(r.Body, buf); err != nil {
			t.Errorf("first MiB: %v", err)
		}
		close(gotFirst)
		n, _ := io.Copy(io.Discard, r.Body)
		writeJSON(w, 200, map[string]any{"path": "/root/big", "size": n + int64(len(buf))})
	})
	pr, pw := io.Pipe()
	go func() {
		chunk := bytes.Repeat([]byte("x"), 1<<20)
		pw.Write(chunk)
		select {
		case <-gotFirst:
		case <-time.After(10 * time.Second):
			pw.CloseWithError(errors.New("server never saw the first chunk: the client buffers"))
			return
		}
		for range 7 {
			pw.Write(chunk)
		}
		pw.Close()
	}()
	n, err := c.WriteFile(context.Background(), "sbx_1", "/root/big", pr, 0o755)
	if err != nil || n != 8<<20 {
		t.Fatalf("%d %v", n, err)
	}
}

func TestArchives(t *testing.T) {
	s, c := newStub(t)
	s.handle("GET /v1/sandboxes/{id}/files/archive", func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Query().Get("path") != "/root/d" {
			t.Errorf("query %v", r.URL.Query())
		}
		w.Header().Set("Content-Type", "application/x-tar")
		io.WriteString(w, "TARDATA")
	})
	s.handle("PUT /v1/sandboxes/{id}/files/archive", func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		if string(b) != "UPLOAD" || r.Header.Get("Content-Type") != "application/x-tar" {
			t.Errorf("upload %q", b)
		}
		writeJSON(w, 200, map[string]any{"path": "/root/d", "files": 4})
	})
	rc, err := c.DownloadArchive(context.Background(), "sbx_1", "/root/d")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(rc)
	rc.Close()
	if string(b) != "TARDATA" {
		t.Errorf("%q", b)
	}
	n, err := c.UploadArchive(context.Background(), "sbx_1", "/root/d", strings.NewReader("UPLOAD"))
	if err != nil || n != 4 {
		t.Fatalf("%d %v", n, err)
	}
}

func TestForkMerge(t *testing.T) {
	s, c := newStub(t)
	var bodies []map[string]any
	s.handle("POST /v1/sandboxes/{id}/fork", func(w http.ResponseWriter, r *http.Request) {
		var req map[string]any
		decodeStrict(t, r, &req)
		bodies = append(bodies, req)
		n := int(req["n"].(float64))
		switch {
		case n < 1 || n > 32:
			writeErr(w, 400, "n must be between 1 and 32")
		case r.PathValue("id") == "objs":
			io.WriteString(w, `{"children":[{"id":"sbx_c1","status":"running"}]}`)
		default:
			io.WriteString(w, `{"children":["sbx_c1","sbx_c2"]}`)
		}
	})
	s.handle("POST /v1/sandboxes/{id}/merge_into/{winner}", func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.PathValue("id") == r.PathValue("winner"):
			writeErr(w, 400, "cannot merge a sandbox into itself")
		case r.PathValue("winner") == "gone":
			writeErr(w, 404, "sandbox not found")
		default:
			w.WriteHeader(204)
		}
	})
	ctx := context.Background()
	kids, err := c.Fork(ctx, "sbx_p", 2)
	if err != nil || !reflect.DeepEqual(kids, []string{"sbx_c1", "sbx_c2"}) {
		t.Fatalf("%v %v", kids, err)
	}
	kids, err = c.Fork(ctx, "objs", 1)
	if err != nil || !reflect.DeepEqual(kids, []string{"sbx_c1"}) {
		t.Fatalf("%v %v", kids, err)
	}
	if _, err := c.Fork(ctx, "sbx_p", 33); !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), "between 1 and 32") {
		t.Fatalf("fork 33: %v", err)
	}
	off, none := false, []string{}
	if _, err := c.ForkWith(ctx, "sbx_p", ForkRequest{N: 2, IngressEnabled: &off, Egress: &none}); err != nil {
		t.Fatal(err)
	}
	want := []map[string]any{{"n": 2.0}, {"n": 1.0}, {"n": 33.0}, {"n": 2.0, "ingress_enabled": false, "egress": []any{}}}
	if !reflect.DeepEqual(bodies, want) {
		t.Errorf("fork bodies %v, want %v", bodies, want)
	}
	if err := c.MergeInto(ctx, "sbx_p", "sbx_c1"); err != nil {
		t.Fatal(err)
	}
	if err := c.MergeInto(ctx, "sbx_p", "sbx_p"); !errors.Is(err, ErrInvalid) {
		t.Fatal(err)
	}
	if err := c.MergeInto(ctx, "sbx_p", "gone"); !errors.Is(err, ErrNotFound) {
		t.Fatal(err)
	}
}

func TestPauseWaitStatus(t *testing.T) {
	s, c := newStub(t)
	var mu sync.Mutex
	statuses := map[string][]string{
		"sbx_1": {"pausing", "pausing", "paused"},
		"sbx_e": {"resuming", "error"},
	}
	var polls []time.Time
	s.handle("POST /v1/sandboxes/{id}/pause", func(w http.ResponseWriter, r *http.Request) {
		if r.PathValue("id") == "busy" {
			writeErr(w, 409, "sandbox is not running")
			return
		}
		w.Header().Set("X-Poll-After", "0.05")
		writeJSON(w, 202, map[string]string{"id": r.PathValue("id"), "status": "pausing"})
	})
	s.handle("POST /v1/sandboxes/{id}/resume", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("X-Poll-After", "1")
		w.WriteHeader(202) // no body
	})
	s.handle("GET /v1/sandboxes/{id}", func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		defer mu.Unlock()
		id := r.PathValue("id")
		polls = append(polls, time.Now())
		seq := statuses[id]
		st := seq[0]
		if len(seq) > 1 {
			statuses[id] = seq[1:]
		}
		w.Header().Set("X-Poll-After", "0.03")
		writeJSON(w, 200, map[string]string{"id": id, "status": st, "error": map[bool]string{true: "out of disk"}[st == "error"]})
	})
	// The server side of a wait: answers once the status is the one asked for, or error, or the timeout passes.
	var waits []url.Values
	s.handle("GET /v1/sandboxes/{id}/wait", func(w http.ResponseWriter, r *http.Request) {
		id, q := r.PathValue("id"), r.URL.Query()
		timeout, err := strconv.ParseFloat(q.Get("timeout_s"), 64)
		if err != nil || timeout > 20 {
			writeErr(w, 400, "bad timeout_s "+q.Get("timeout_s"))
			return
		}
		mu.Lock()
		waits = append(waits, q)
		mu.Unlock()
		deadline := time.Now().Add(time.Duration(timeout * float64(time.Second)))
		for {
			mu.Lock()
			seq := statuses[id]
			st := seq[0]
			if len(seq) > 1 {
				statuses[id] = seq[1:]
			}
			mu.Unlock()
			if st == q.Get("status") || st == "error" || time.Now().After(deadline) {
				writeJSON(w, 200, map[string]string{"id": id, "status": st, "error": map[bool]string{true: "out of disk"}[st == "error"]})
				return
			}
			time.Sleep(5 * time.Millisecond)
		}
	})
	ctx := context.Background()
	sb, wait, err := c.Pause(ctx, "sbx_1")
	if err != nil || sb.Status != "pausing" || wait != 50*time.Millisecond {
		t.Fatalf("pause %+v %v %v", sb, wait, err)
	}
	if _, _, err := c.Pause(ctx, "busy"); !errors.Is(err, ErrConflict) {
		t.Fatalf("pause busy: %v", err)
	}
	sb, wait, err = c.Resume(ctx, "sbx_x")
	if err != nil || sb.ID != "sbx_x" || wait != time.Second {
		t.Fatalf("resume %+v %v %v", sb, wait, err)
	}
	sb, err = c.WaitStatus(ctx, "sbx_1", StatusPaused)
	if err != nil || sb.Status != "paused" {
		t.Fatalf("wait %+v %v", sb, err)
	}
	mu.Lock()
	if len(waits) != 1 || waits[0].Get("status") != "paused" || len(polls) != 0 {
		t.Errorf("wait requests %v and polls %d, want one wait for paused and no polls", waits, len(polls))
	}
	mu.Unlock()
	sb, err = c.WaitStatus(ctx, "sbx_e", StatusRunning)
	var se *StatusError
	if !errors.As(err, &se) || se.Sandbox.Error != "out of disk" || sb.Status != "error" {
		t.Fatalf("wait error: %+v %v", sb, err)
	}
	// A status that never comes: the context ends the wait.
	mu.Lock()
	statuses["sbx_s"] = []string{"pausing"}
	mu.Unlock()
	cctx, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	if _, err := c.WaitStatus(cctx, "sbx_s", StatusPaused); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("wait timeout: %v", err)
	}
}

// A resume that failed leaves the sandbox paused with pause.error set; the server's wait for running answers
// then, and WaitStatus returns a *ResumeError at once rather than waiting on.
func TestWaitStatusResumeFailed(t *testing.T) {
	s, c := newStub(t)
	s.handle("GET /v1/sandboxes/{id}/wait", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, 200, map[string]any{"id": r.PathValue("id"), "status": "paused",
			"pause": map[string]string{"error": "resume failed: the store did not answer"}})
	})
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	sb, err := c.WaitStatus(ctx, "sbx_1", StatusRunning)
	var re *ResumeError
	if !errors.As(err, &re) || sb == nil || sb.Status != StatusPaused || !strings.Contains(err.Error(), "the store did not answer") {
		t.Fatalf("wait for running after a failed resume: %+v %v, want a *ResumeError", sb, err)
	}
}

func TestPollAfter(t *testing.T) {
	for v, want := range map[string]time.Duration{"": 0, "2": 2 * time.Second, "0.5": 500 * time.Millisecond, "250ms": 250 * time.Millisecond, "-1": 0, "soon": 0} {
		h := http.Header{}
		if v != "" {
			h.Set("X-Poll-After", v)
		}
		if got := pollAfter(h); got != want {
			t.Errorf("%q: %v, want %v", v, got, want)
		}
	}
}

func TestDiff(t *testing.T) {
	s, c := newStub(t)
	s.handle("GET /v1/sandboxes/{id}/diff/{other}", func(w http.ResponseWriter, r *http.Request) {
		if r.PathValue("other") == "paused" {
			writeErr(w, 409, "sandbox is not running")
			return
		}
		if r.PathValue("id") != "a" || r.PathValue("other") != "b" {
			t.Errorf("ids %s %s", r.PathValue("id"), r.PathValue("other"))
		}
		if got := r.URL.Query()["paths"]; !reflect.DeepEqual(got, []string{"/root", "/srv"}) {
			t.Errorf("paths %q", got)
		}
		writeJSON(w, 200, Diff{Added: []string{"/root/b.txt"}, Removed: []string{"/root/a.txt"}, Modified: []string{"/srv/mod"}})
	})
	d, err := c.Diff(context.Background(), "a", "b", []string{"/root", "/srv"})
	if err != nil {
		t.Fatal(err)
	}
	want := &Diff{Added: []string{"/root/b.txt"}, Removed: []string{"/root/a.txt"}, Modified: []string{"/srv/mod"}}
	if !reflect.DeepEqual(d, want) {
		t.Errorf("diff %+v, want %+v", d, want)
	}
	if _, err := c.Diff(context.Background(), "a", "paused", []string{"/root", "/srv"}); !errors.Is(err, ErrConflict) {
		t.Errorf("paused: %v", err)
	}
	if _, err := c.Diff(context.Background(), "a", "b", []string{"rel"}); !errors.Is(err, ErrInvalid) {
		t.Errorf("relative: %v", err)
	}
}

func TestContextCancelsStream(t *testing.T) {
	s, c := newStub(t)
	s.handle("POST /v1/sandboxes/{id}/exec", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/x-ndjson")
		io.WriteString(w, `{"type":"stdout","data":"x"}`+"\n")
		w.(http.Flusher).Flush()
		<-r.Context().Done()
	})
	ctx, cancel := context.WithCancel(context.Background())
	_, err := c.ExecStream(ctx, "sbx_1", ExecRequest{Cmd: "sleep 100"}, func(Event) { cancel() })
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("%v", err)
	}
}

func TestSetTimeoutAndRunEnv(t *testing.T) {
	s, c := newStub(t)
	exp := time.Date(2026, 11, 23, 14, 0, 0, 0, time.UTC)
	s.handle("POST /v1/sandboxes/{id}/timeout", func(w http.ResponseWriter, r *http.Request) {
		var req map[string]any
		decodeStrict(t, r, &req)
		if !reflect.DeepEqual(req, map[string]any{"timeout_s": float64(600)}) {
			t.Errorf("body %v", req)
		}
		writeJSON(w, 200, map[string]any{"id": r.PathValue("id"), "status": "running", "timeout_s": 600, "expires_at": exp})
	})
	s.handle("POST /v1/sandboxes/{id}/run_code", func(w http.ResponseWriter, r *http.Request) {
		var req map[string]any
		decodeStrict(t, r, &req)
		if !reflect.DeepEqual(req, map[string]any{"code": "x", "env": map[string]any{"A": "1"}}) {
			t.Errorf("body %v", req)
		}
		io.WriteString(w, `{"stdout":"","stderr":"","value":"1","error":null,"execution_count":1}`)
	})
	sb, err := c.SetTimeout(context.Background(), "sbx_1", 600)
	if err != nil || sb.TimeoutS != 600 || sb.ExpiresAt == nil || !sb.ExpiresAt.Equal(exp) {
		t.Fatalf("SetTimeout = %+v, %v", sb, err)
	}
	if _, err := c.RunCode(context.Background(), "sbx_1", RunCodeRequest{Code: "x", Env: map[string]string{"A": "1"}}); err != nil {
		t.Fatal(err)
	}
}

// TestConcurrentCallsKeepTheirConnections: a round of 16 calls at once (a fork's children) opens 16 connections,
// and the next round reuses them all (net/http's default client keeps 2, so it opened 14 again).
func TestConcurrentCallsKeepTheirConnections(t *testing.T) {
	s, c := newStub(t)
	opened := &s.opened
	const n = 16
	var inFlight sync.WaitGroup
	s.handle("POST /v1/sandboxes/{id}/run_code", func(w http.ResponseWriter, r *http.Request) {
		inFlight.Done()
		inFlight.Wait() // all n at once: n connections
		writeJSON(w, 200, map[string]any{"stdout": "", "stderr": "", "value": "2", "execution_count": 1})
	})
	round := func() {
		inFlight.Add(n)
		var wg sync.WaitGroup
		for i := range n {
			wg.Add(1)
			go func() {
				defer wg.Done()
				if _, err := c.RunCode(context.Background(), fmt.Sprintf("sbx_%d", i), RunCodeRequest{Code: "1+1"}); err != nil {
					t.Error(err)
				}
			}()
		}
		wg.Wait()
	}
	round()
	if got := opened.Load(); got != n {
		t.Fatalf("the first round opened %d connections, want %d", got, n)
	}
	round()
	if got := opened.Load(); got != n {
		t.Fatalf("the second round opened %d more connections, want 0", got-n)
	}
}
