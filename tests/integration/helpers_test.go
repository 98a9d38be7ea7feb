// Package integration holds ramify's end-to-end tests: a real server binary, real sandboxes (namespaces,
// cgroups, overlay layers, network), driven through the Go client and raw HTTP.
package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ramify-dev/ramify/client"
	"github.com/ramify-dev/ramify/internal/testserver"
)

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func create(t testing.TB, s *testserver.Server, req *client.CreateRequest) string {
	t.Helper()
	if req == nil {
		req = &client.CreateRequest{}
	}
	sb, err := s.Client.Create(ctxT(t), *req)
	if err != nil {
		t.Fatalf("create: %v", err)
	}
	if sb.Status != "running" {
		t.Fatalf("new sandbox status %q", sb.Status)
	}
	return sb.ID
}

func run(t testing.TB, s *testserver.Server, id, code string) *client.Execution {
	t.Helper()
	ex, err := s.Client.RunCode(ctxT(t), id, client.RunCodeRequest{Code: code})
	if err != nil {
		t.Fatalf("run_code %q: %v", code, err)
	}
	return ex
}

// value runs code and returns its trailing expression's repr, failing on an exception.
func value(t testing.TB, s *testserver.Server, id, code string) string {
	t.Helper()
	ex := run(t, s, id, code)
	if ex.Error != nil {
		t.Fatalf("run_code %q raised %s: %s\n%s", code, ex.Error.Name, ex.Error.Value, ex.Error.Traceback)
	}
	if ex.Value == nil {
		return ""
	}
	return *ex.Value
}

func sh(t testing.TB, s *testserver.Server, id, cmd string) *client.ExecResult {
	t.Helper()
	res, err := s.Client.Exec(ctxT(t), id, client.ExecRequest{Cmd: cmd})
	if err != nil {
		t.Fatalf("exec %q: %v", cmd, err)
	}
	return res
}

// raw sends a request with the given key and returns status and decoded JSON body.
func raw(t testing.TB, s *testserver.Server, method, path, key string, body []byte) (int, map[string]any) {
	t.Helper()
	req, _ := http.NewRequest(method, s.URL+path, bytes.NewReader(body))
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	var m map[string]any
	if len(b) > 0 && strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") {
		if err := json.Unmarshal(b, &m); err != nil {
			t.Fatalf("%s %s: body is not JSON: %q", method, path, b)
		}
	}
	return resp.StatusCode, m
}

func wantError(t testing.TB, code int, body map[string]any, wantCode int, wantMsg string) {
	t.Helper()
	if code != wantCode {
		t.Errorf("status %d, want %d (body %v)", code, wantCode, body)
		return
	}
	msg, _ := body["error"].(string)
	if msg == "" || (wantMsg != "" && !strings.Contains(msg, wantMsg)) {
		t.Errorf("error body %v, want an error containing %q", body, wantMsg)
	}
}

// sortedLines returns out's lines sorted, joined by newlines: for output that comes partly from print() (through
// the interpreter's connection) and partly from fd 1 (a subprocess's, through a pipe), whose order is not kept.
func sortedLines(out string) string {
	lines := strings.Split(strings.TrimRight(out, "\n"), "\n")
	slices.Sort(lines)
	return strings.Join(lines, "\n")
}

// stopAgent stops sandbox id's agent (SIGSTOP, as from the host) and returns the function that lets it run
// again; it also runs, once more and harmlessly, when the test ends, whatever happened.
func stopAgent(t *testing.T, id string) (cont func()) {
	t.Helper()
	pid := testserver.AgentPid(id)
	if pid == 0 {
		t.Fatalf("%s: no agent found", id)
	}
	if err := unix.Kill(pid, unix.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Kill(pid, unix.SIGCONT) }) //nolint:errcheck // on a failure before cont
	return func() {
		t.Helper()
		if err := unix.Kill(pid, unix.SIGCONT); err != nil {
			t.Fatal(err)
		}
	}
}
