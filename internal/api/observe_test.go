package api

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/ramify-dev/ramify/internal/metrics"
)

// Every route of an operation the metrics name maps to that op, and only those routes do.
func TestOpOfEveryRoute(t *testing.T) {
	s := newDocTestServer()
	want := map[string]string{
		"POST /v1/sandboxes":                          "create",
		"DELETE /v1/sandboxes/{id}":                   "delete",
		"POST /v1/sandboxes/{id}/fork":                "fork",
		"POST /v1/sandboxes/{id}/merge_into/{winner}": "merge",
		"GET /v1/sandboxes/{id}/diff/{other}":         "diff",
		"POST /v1/sandboxes/{id}/diff/{other}":        "diff",
		"POST /v1/sandboxes/{id}/pause":               "pause",
		"POST /v1/sandboxes/{id}/resume":              "resume",
		"POST /v1/sandboxes/{id}/run_code":            "run_code",
		"POST /v1/sandboxes/{id}/exec":                "exec",
		"GET /v1/sandboxes/{id}/files":                "files",
		"PUT /v1/sandboxes/{id}/files/archive":        "files",
		"GET /v1/sandboxes/{id}":                      "",
		"GET /v1/events":                              "",
		"GET /metrics":                                "",
		"POST /v1/sandboxes/{id}/interrupt":           "",
	}
	ops := map[string]bool{}
	for _, op := range metrics.Ops {
		ops[op] = true
	}
	for _, p := range s.patterns {
		got := opOf(p)
		if w, ok := want[p]; ok && got != w {
			t.Errorf("opOf(%q) = %q, want %q", p, got, w)
		}
		if got != "" && !ops[got] {
			t.Errorf("opOf(%q) = %q, which metrics.Ops lacks", p, got)
		}
		if strings.Contains(p, "/files") && got != "files" {
			t.Errorf("files route %q is not counted as files", p)
		}
	}
}

// Without metrics and events wired in, their routes say they are off (404 JSON), and they need the key.
func TestObserveRoutesOff(t *testing.T) {
	s := newDocTestServer()
	for _, path := range []string{"/metrics", "/v1/events"} {
		rec := httptest.NewRecorder()
		req := httptest.NewRequest(http.MethodGet, path, nil)
		s.ServeHTTP(rec, req)
		if rec.Code != http.StatusUnauthorized {
			t.Errorf("%s without a key: %d", path, rec.Code)
		}
		rec = httptest.NewRecorder()
		req.Header.Set("Authorization", "Bearer key")
		s.ServeHTTP(rec, req)
		if rec.Code != http.StatusNotFound || !strings.Contains(rec.Body.String(), "off on this server") {
			t.Errorf("%s: %d %s", path, rec.Code, rec.Body)
		}
	}
}
