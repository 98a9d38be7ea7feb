package api

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/ramify-dev/ramify/internal/errdefs"
	"github.com/ramify-dev/ramify/internal/sandbox"
)

// newTestServer is a Server without a sandbox service: it serves what is decided before the service is called
// (decoding, validation, authentication), which is what these tests drive.
func newTestServer() *Server { return New(nil, "key", "test", slog.New(slog.DiscardHandler)) }

func call(t *testing.T, s *Server, method, path, body string) (int, string) {
	t.Helper()
	req := httptest.NewRequest(method, path, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer key")
	rec := httptest.NewRecorder()
	s.ServeHTTP(rec, req)
	var out struct {
		Error string `json:"error"`
	}
	if err := jsonUnmarshal(rec.Body.Bytes(), &out); err != nil {
		t.Fatalf("%s %s: body %q is not JSON", method, path, rec.Body.String())
	}
	return rec.Code, out.Error
}

// Requests the API refuses before doing anything: 400 with a message that says what is wrong.
func TestBadInput(t *testing.T) {
	s := newTestServer()
	id := sandbox.NewID()
	for _, tc := range []struct {
		method, path, body string
		code               int
		msg                string
	}{
		{"POST", "/v1/sandboxes/" + id + "/fork", `{"n": null}`, 400, "n must be an integer between 1 and 32"},
		{"POST", "/v1/sandboxes/" + id + "/fork", `{"n": "3"}`, 400, "n must be an integer between 1 and 32"},
		{"POST", "/v1/sandboxes/" + id + "/fork", `{"n": 1.5}`, 400, "n must be an integer between 1 and 32"},
		{"POST", "/v1/sandboxes/" + id + "/fork", `{"bogus": 1}`, 400, `unknown field "bogus"`},
		{"POST", "/v1/sandboxes", `{"vcpu": 1, "bogus": true}`, 400, `unknown field "bogus"`},
		{"POST", "/v1/sandboxes/" + id + "/fork", `{"n": 2`, 400, "malformed JSON: unexpected EOF"},
		{"GET", "/v1/sandboxes?status=bogus", "", 400, `unknown status "bogus"`},
		{"GET", "/v1/sandboxes/" + id + "/wait", "", 400, "status is required"},
		{"GET", "/v1/sandboxes/" + id + "/wait?status=paused&timeout_s=999", "", 400, "timeout_s must be a number of seconds between 0 and 60"},
		{"GET", "/v1/sandboxes/" + id + "/wait?status=paused&timeout_s=-1", "", 400, "timeout_s must be a number of seconds between 0 and 60"},
		{"POST", "/v1/sandboxes/" + id + "/run_code", `{}`, 400, "code is required"},
		{"POST", "/v1/sandboxes/" + id + "/run_code", `{"code": null}`, 400, "code is required"},
		{"POST", "/v1/sandboxes/" + id + "/run_code", `{"code": 1}`, 400, "code: expected a string, got number"},
		{"POST", "/v1/sandboxes", `{"vcpu": "2"}`, 400, "vcpu: expected a number, got string"},
		{"POST", "/v1/sandboxes", `{"env": {"A": 1}}`, 400, "env: expected a string, got number"},
		{"POST", "/v1/sandboxes/" + id + "/exec", `{"argv": "ls"}`, 400, "argv: expected an array, got string"},
		{"POST", "/v1/sandboxes", `[1]`, 400, "request body must be a JSON object"},
		{"POST", "/v1/sandboxes/" + id + "/run_code", `{"code": "1", "bogus": 2}`, 400, `unknown field "bogus"`},
		{"POST", "/v1/sandboxes/" + id + "/files/mkdir", `{}`, 400, "path is required"},
		{"POST", "/v1/sandboxes/" + id + "/files/mkdir", `{"path": null}`, 400, "path is required"},
		{"POST", "/v1/sandboxes/" + id + "/exec", `{"cmd": null}`, 400, "exactly one of cmd and argv is required"},
		{"POST", "/v1/sandboxes/" + id + "/exec", `{"cmd": "echo a\u0000b"}`, 400, "cmd must not contain NUL bytes"},
		{"POST", "/v1/sandboxes/" + id + "/exec", `{"argv": ["echo", "a\u0000"]}`, 400, "argv must not contain NUL bytes"},
		{"POST", "/v1/sandboxes/" + id + "/exec", `{"cmd": "pwd", "cwd": "/tmp\u0000x"}`, 400, "cwd must not contain NUL bytes"},
	} {
		code, msg := call(t, s, tc.method, tc.path, tc.body)
		if code != tc.code || msg != tc.msg && !strings.HasPrefix(msg, tc.msg) {
			t.Errorf("%s %s %s: %d %q, want %d %q", tc.method, tc.path, tc.body, code, msg, tc.code, tc.msg)
		}
	}
}

// The list's metadata filter: metadata[k] (deepObject, what generated clients send) and metadata.k.
func TestMetadataKey(t *testing.T) {
	for _, tc := range []struct {
		param, key string
		ok         bool
	}{
		{"metadata[project]", "project", true}, {"metadata.project", "project", true}, {"metadata[a.b]", "a.b", true},
		{"metadata[x", "", false}, {"status", "", false}, {"metadataX", "", false},
	} {
		key, ok := metadataKey(tc.param)
		if ok != tc.ok || ok && key != tc.key {
			t.Errorf("metadataKey(%q) = %q, %v; want %q, %v", tc.param, key, ok, tc.key, tc.ok)
		}
	}
}

// The one place errors become statuses.
func TestStatusOf(t *testing.T) {
	for _, tc := range []struct {
		err  error
		code int
	}{
		{errdefs.New(errdefs.ErrInvalid, "x"), 400},
		{fmt.Errorf("wrapped: %w", errdefs.New(errdefs.ErrNotFound, "x")), 404},
		{errdefs.New(errdefs.ErrConflict, "x"), 409},
		{errdefs.New(errdefs.ErrUnauthorized, "x"), 401},
		{errdefs.New(errdefs.ErrTooLarge, "x"), 413},
		{&http.MaxBytesError{Limit: 1}, 413},
		{fmt.Errorf("write /x: %w", errBodyTimeout), 408},
		{errors.New("anything else"), 500},
	} {
		if got := statusOf(tc.err); got != tc.code {
			t.Errorf("statusOf(%v) = %d, want %d", tc.err, got, tc.code)
		}
	}
}

// slowServer serves s (with a short body idle timeout) plus a test route that reads its whole body.
func slowServer(t *testing.T, idle time.Duration) *httptest.Server {
	s := newTestServer()
	s.bodyIdle = idle
	s.handle("PUT /test/upload", s.auth(func(w http.ResponseWriter, r *http.Request) {
		n, err := io.Copy(io.Discard, r.Body)
		if err != nil {
			writeError(w, err)
			return
		}
		writeJSON(w, 200, map[string]int64{"size": n})
	}))
	srv := httptest.NewServer(s)
	t.Cleanup(srv.Close)
	return srv
}

// A client with a valid key that stops sending its body gets 408 and its connection closed, instead of holding
// it forever; the same holds for a JSON body.
func TestStalledBody(t *testing.T) {
	srv := slowServer(t, 300*time.Millisecond)
	for _, path := range []string{"/test/upload", "/v1/sandboxes/" + sandbox.NewID() + "/fork"} {
		method := "PUT"
		if strings.HasSuffix(path, "fork") {
			method = "POST"
		}
		c, err := net.Dial("tcp", srv.Listener.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		fmt.Fprintf(c, "%s %s HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer key\r\nContent-Length: 100\r\n\r\n{\"n\":", method, path)
		c.SetReadDeadline(time.Now().Add(20 * time.Second)) // far beyond the server's 300 ms: only a hang reaches it
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Errorf("%s: no response to a stalled body: %v", path, err)
			c.Close()
			continue
		}
		b, _ := io.ReadAll(resp.Body)
		if resp.StatusCode != http.StatusRequestTimeout || !strings.Contains(string(b), "request body not received in time") {
			t.Errorf("%s: %d %s, want 408", path, resp.StatusCode, b)
		}
		c.Close()
	}
}

// An upload that keeps sending is never cut off by the idle timeout, however long it takes in all.
func TestSlowButSteadyUpload(t *testing.T) {
	idle := 400 * time.Millisecond
	srv := slowServer(t, idle)
	pr, pw := io.Pipe()
	go func() {
		// About 3 idle timeouts in all, a chunk every 20 ms.
		for deadline := time.Now().Add(3 * idle); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
			if _, err := pw.Write(make([]byte, 1000)); err != nil {
				return
			}
		}
		pw.Close()
	}()
	req, _ := http.NewRequest("PUT", srv.URL+"/test/upload", pr)
	req.Header.Set("Authorization", "Bearer key")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		t.Fatalf("steady upload: %d %s", resp.StatusCode, b)
	}
}

func jsonUnmarshal(b []byte, v any) error { return json.Unmarshal(b, v) }

// A body read to its end clears the deadline: a handler that works longer than the idle timeout afterwards
// keeps its request context (a deadline left set would fire in net/http's background read and cancel it).
func TestLongHandlerAfterBody(t *testing.T) {
	idle := 100 * time.Millisecond
	s := newTestServer()
	s.bodyIdle = idle
	s.handle("POST /test/long", s.auth(func(w http.ResponseWriter, r *http.Request) {
		io.Copy(io.Discard, r.Body)
		select {
		case <-r.Context().Done():
			writeJSON(w, 500, map[string]string{"error": "context cancelled"})
		case <-time.After(5 * idle):
			writeJSON(w, 200, map[string]string{})
		}
	}))
	srv := httptest.NewServer(s)
	defer srv.Close()
	req, _ := http.NewRequest("POST", srv.URL+"/test/long", strings.NewReader(`{"code": "x"}`))
	req.Header.Set("Authorization", "Bearer key")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("status %d: the request's context was cancelled after its body was read", resp.StatusCode)
	}
}

// The key is accepted as "Authorization: Bearer <key>" or "X-Api-Key: <key>"; anything else is 401.
func TestAuthHeaders(t *testing.T) {
	s := newTestServer()
	for _, c := range []struct {
		name, header, value string
		want                int
	}{
		{"bearer", "Authorization", "Bearer key", http.StatusBadRequest},
		{"x-api-key", "X-Api-Key", "key", http.StatusBadRequest},
		{"wrong x-api-key", "X-Api-Key", "nope", http.StatusUnauthorized},
		{"basic", "Authorization", "Basic key", http.StatusUnauthorized},
		{"none", "X-Other", "key", http.StatusUnauthorized},
	} {
		// A fork with a bad n: 400 once authenticated, decided before the (absent) service is called.
		req := httptest.NewRequest("POST", "/v1/sandboxes/sbx_0123456789abcdef0123456789abcdef/fork", strings.NewReader(`{"n": 0}`))
		req.Header.Set(c.header, c.value)
		rec := httptest.NewRecorder()
		s.ServeHTTP(rec, req)
		if rec.Code != c.want {
			t.Errorf("%s: %d %s, want %d", c.name, rec.Code, rec.Body, c.want)
		}
	}
}

// A download the client stops reading ends after the idle timeout (its handler returns, so the files call's
// hold on its sandbox ends), and stop ends one at once; a download read steadily is never cut off, and a
// response finished leaves no deadline on its connection for the next one.
func TestTransferWriterDeadlines(t *testing.T) {
	var idle atomic.Int64
	idle.Store(int64(300 * time.Millisecond))
	ended := make(chan error, 1)
	var stopNow chan struct{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tw := &transferWriter{ResponseWriter: w, rc: http.NewResponseController(w), idle: time.Duration(idle.Load())}
		defer tw.done()
		if r.URL.Path == "/stop" {
			go func() { <-stopNow; tw.stop() }()
		}
		n := 64 << 20
		if r.URL.Path == "/small" {
			n = 1 << 20
		}
		_, err := io.Copy(tw, io.LimitReader(zeros{}, int64(n)))
		ended <- err
	}))
	defer srv.Close()
	stalled := func(path string) net.Conn {
		c, err := net.Dial("tcp", srv.Listener.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		c.(*net.TCPConn).SetReadBuffer(4096)
		fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: x\r\n\r\n", path)
		return c
	}
	// Stalled: cut off after the idle timeout.
	c := stalled("/big")
	select {
	case err := <-ended:
		if err == nil {
			t.Errorf("a download the client never read ended without an error")
		}
	case <-time.After(20 * time.Second):
		t.Fatal("a download the client never read was not cut off")
	}
	c.Close()
	// Stopped: at once, long before the idle timeout would.
	idle.Store(int64(time.Hour))
	stopNow = make(chan struct{})
	c = stalled("/stop")
	time.Sleep(200 * time.Millisecond) // the client's buffers full, the handler blocked in a write
	close(stopNow)
	select {
	case err := <-ended:
		if err == nil {
			t.Errorf("a stopped download ended without an error")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("a stopped download did not end")
	}
	c.Close()
	// Read steadily (slower than one idle timeout in all), then a second response on the same connection that
	// starts after more than the idle timeout: neither is cut off.
	idle.Store(int64(200 * time.Millisecond))
	tr := &http.Transport{}
	defer tr.CloseIdleConnections()
	hc := &http.Client{Transport: tr}
	for i := range 2 {
		resp, err := hc.Get(srv.URL + "/small")
		if err != nil {
			t.Fatal(err)
		}
		var got int
		buf := make([]byte, 64<<10)
		for {
			n, err := resp.Body.Read(buf)
			got += n
			if err != nil {
				break
			}
			if i == 0 {
				time.Sleep(10 * time.Millisecond) // ~16 reads of 64 KiB: ~0.2 s in all, each well within idle
			}
		}
		resp.Body.Close()
		if err := <-ended; err != nil || got != 1<<20 {
			t.Errorf("response %d: %d bytes, handler's error %v", i, got, err)
		}
		time.Sleep(400 * time.Millisecond) // twice the idle timeout
	}
}

type zeros struct{}

func (zeros) Read(p []byte) (int, error) { clear(p); return len(p), nil }
