// Package ui owns the web console: the static HTML, CSS and JavaScript under static/, embedded in the binary and
// served at /ui/ by `ramify serve`. The console is a plain client of the API: it holds no state on the server and
// calls the same authenticated routes as every other client, with the key the user signs in with.
package ui

import (
	"embed"
	"io/fs"
	"net/http"
	"strings"
)

//go:embed static
var static embed.FS

// Prefix is where the console is served.
const Prefix = "/ui/"

// Handler serves the console's files at /ui/ (and redirects /ui to /ui/). The files are public: they hold no
// secret, and every API call they make carries the key the user signed in with.
func Handler() http.Handler {
	sub, err := fs.Sub(static, "static")
	if err != nil {
		panic(err) // the embedded tree always has static/
	}
	files := http.StripPrefix(Prefix, http.FileServerFS(sub))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			w.Header().Set("Allow", "GET, HEAD")
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusMethodNotAllowed)
			w.Write([]byte(`{"error": "method ` + r.Method + ` not allowed on ` + Prefix + `"}` + "\n")) //nolint:errcheck // the client went away
			return
		}
		h := w.Header()
		// Nothing the console loads comes from elsewhere, and it runs no inline script.
		h.Set("Content-Security-Policy", "default-src 'self'; img-src 'self' data: blob:; style-src 'self'; script-src 'self'; connect-src 'self'; frame-ancestors 'none'")
		h.Set("X-Content-Type-Options", "nosniff")
		h.Set("Referrer-Policy", "no-referrer")
		h.Set("Cache-Control", "no-cache")
		files.ServeHTTP(w, r)
	})
}

// With returns api with the console mounted at /ui/ in front of it: every other path goes to api.
func With(api http.Handler) http.Handler {
	console := Handler()
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.URL.Path == "/ui":
			http.Redirect(w, r, Prefix, http.StatusMovedPermanently)
		case strings.HasPrefix(r.URL.Path, Prefix):
			console.ServeHTTP(w, r)
		default:
			api.ServeHTTP(w, r)
		}
	})
}
