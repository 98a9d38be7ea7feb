package api

import (
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"
)

// openAPIRoutes returns "METHOD /path" for every operation in the embedded document.
func openAPIRoutes(t *testing.T) []string {
	t.Helper()
	var doc struct {
		OpenAPI string                                `json:"openapi"`
		Paths   map[string]map[string]json.RawMessage `json:"paths"`
	}
	if err := json.Unmarshal(openAPIDoc, &doc); err != nil {
		t.Fatalf("openapi.json does not parse: %v", err)
	}
	if !strings.HasPrefix(doc.OpenAPI, "3.1") {
		t.Fatalf("openapi = %q, want 3.1.x", doc.OpenAPI)
	}
	var out []string
	for path, item := range doc.Paths {
		for key := range item {
			switch key {
			case "get", "put", "post", "delete", "patch", "head", "options", "trace":
				out = append(out, strings.ToUpper(key)+" "+path)
			}
		}
	}
	return out
}

func newDocTestServer() *Server {
	return New(nil, "key", "test", slog.New(slog.DiscardHandler))
}

func TestOpenAPIDocument(t *testing.T) {
	var doc map[string]any
	if err := json.Unmarshal(openAPIDoc, &doc); err != nil {
		t.Fatalf("openapi.json does not parse: %v", err)
	}
	comps, _ := doc["components"].(map[string]any)
	schemas, _ := comps["schemas"].(map[string]any)
	for _, name := range []string{"Sandbox", "Execution", "ExecError", "ExecResult",
		"Entry", "ForkResult", "Diff", "PauseInfo", "Error"} {
		if _, ok := schemas[name]; !ok {
			t.Errorf("components.schemas has no %s", name)
		}
	}
	// Request bodies live in components.requestBodies, not schemas: there openapi-typescript keeps a field with a
	// default optional (in components.schemas it makes it required).
	bodies, _ := comps["requestBodies"].(map[string]any)
	for _, name := range []string{"CreateRequest", "RunCodeRequest", "ExecRequest", "ForkRequest"} {
		if _, ok := bodies[name]; !ok {
			t.Errorf("components.requestBodies has no %s", name)
		}
	}
	if ss, _ := comps["securitySchemes"].(map[string]any); ss["bearerAuth"] == nil {
		t.Error("components.securitySchemes has no bearerAuth")
	}
	if len(openAPIRoutes(t)) == 0 {
		t.Fatal("the document has no operations")
	}
}

func TestOpenAPIMatchesRoutes(t *testing.T) {
	s := newDocTestServer()
	registered := map[string]bool{}
	for _, p := range s.patterns {
		method, path, ok := strings.Cut(p, " ")
		if !ok {
			t.Fatalf("pattern %q has no method: every route should name one", p)
		}
		// A trailing {name...} (the rest of the path) is {name} in the document.
		registered[method+" "+strings.ReplaceAll(path, "...}", "}")] = true
	}
	documented := map[string]bool{}
	for _, r := range openAPIRoutes(t) {
		documented[r] = true
	}
	var missing, extra []string
	for r := range registered {
		if !documented[r] {
			missing = append(missing, r)
		}
	}
	for r := range documented {
		if !registered[r] {
			extra = append(extra, r)
		}
	}
	slices.Sort(missing)
	slices.Sort(extra)
	if len(missing) > 0 {
		t.Errorf("routes missing from openapi.json:\n  %s", strings.Join(missing, "\n  "))
	}
	if len(extra) > 0 {
		t.Errorf("openapi.json operations with no registered route:\n  %s", strings.Join(extra, "\n  "))
	}
	if len(registered) < 20 {
		t.Errorf("only %d routes recorded; is every route registered through s.handle?", len(registered))
	}
}

func TestOpenAPIServedWithoutAuth(t *testing.T) {
	s := newDocTestServer()
	rec := httptest.NewRecorder()
	s.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, "/v1/openapi.json", nil))
	if rec.Code != http.StatusOK {
		t.Fatalf("status %d, want 200: %s", rec.Code, rec.Body)
	}
	if ct := rec.Header().Get("Content-Type"); ct != "application/json" {
		t.Errorf("Content-Type %q, want application/json", ct)
	}
	var doc struct {
		OpenAPI string `json:"openapi"`
	}
	if err := json.Unmarshal(rec.Body.Bytes(), &doc); err != nil || !strings.HasPrefix(doc.OpenAPI, "3.1") {
		t.Fatalf("body is not an OpenAPI 3.1 document (openapi=%q, err=%v)", doc.OpenAPI, err)
	}
}
