package ui

import (
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
)

func TestWith(t *testing.T) {
	api := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "api "+r.URL.Path) })
	h := With(api)
	get := func(method, path string) *httptest.ResponseRecorder {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest(method, path, nil))
		return rec
	}
	if r := get("GET", "/ui/"); r.Code != 200 || !strings.Contains(r.Body.String(), `<script src="app.js">`) {
		t.Fatalf("GET /ui/: %d %q", r.Code, r.Body.String())
	} else if csp := r.Header().Get("Content-Security-Policy"); !strings.Contains(csp, "default-src 'self'") {
		t.Errorf("GET /ui/ CSP %q", csp)
	}
	// Every file the page names is served.
	index := get("GET", "/ui/").Body.String()
	refs := regexp.MustCompile(`(?:src|href)="([a-z]+\.[a-z]+)"`).FindAllStringSubmatch(index, -1)
	if len(refs) < 4 {
		t.Fatalf("index.html names only %v", refs)
	}
	for _, m := range refs {
		if r := get("GET", "/ui/"+m[1]); r.Code != 200 || r.Body.Len() == 0 {
			t.Errorf("GET /ui/%s (named by index.html): %d", m[1], r.Code)
		}
	}
	if r := get("GET", "/ui"); r.Code != http.StatusMovedPermanently || r.Header().Get("Location") != "/ui/" {
		t.Errorf("GET /ui: %d to %q", r.Code, r.Header().Get("Location"))
	}
	if r := get("POST", "/ui/"); r.Code != http.StatusMethodNotAllowed || !strings.HasPrefix(r.Body.String(), `{"error": `) {
		t.Errorf("POST /ui/: %d %q", r.Code, r.Body.String())
	}
	if r := get("GET", "/ui/nothing.js"); r.Code != 404 {
		t.Errorf("GET /ui/nothing.js: %d", r.Code)
	}
	for _, p := range []string{"/v1/sandboxes", "/healthz", "/uix"} {
		if r := get("GET", p); r.Body.String() != "api "+p {
			t.Errorf("GET %s went to %q, want the API", p, r.Body.String())
		}
	}
}
