// Package api is ramify's HTTP API: routing, bearer-key authentication, JSON decoding with size limits,
// NDJSON streaming, and the one place where errors become HTTP statuses. Handlers are thin: decode, call the
// sandbox service, encode.
package api

import (
	"crypto/subtle"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"reflect"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/ramify-dev/ramify/internal/errdefs"
	"github.com/ramify-dev/ramify/internal/sandbox"
)

var errNotFound = errdefs.New(errdefs.ErrNotFound, "sandbox not found")

// MaxJSONBody limits JSON request bodies.
const MaxJSONBody = 8 << 20

// BodyIdleTimeout bounds how long a request body may make no progress: a client that stops sending its body
// (a slow or stalled upload, or a JSON body that never ends) gets 408 and its connection closed. The deadline
// moves with every read, so a large upload that keeps sending is never cut off.
const BodyIdleTimeout = 30 * time.Second

// Server serves the API.
type Server struct {
	svc      *sandbox.Service
	key      string
	log      *slog.Logger
	version  string
	bodyIdle time.Duration // BodyIdleTimeout; tests shorten it
	mux      *http.ServeMux
	// patterns lists every pattern registered on mux, in order (the OpenAPI test compares them to the document).
	patterns []string
	obs      observer // events, metrics, logs (observe.go)
	idem     *idemStore
}

// New returns the API handler.
func New(svc *sandbox.Service, apiKey, version string, log *slog.Logger) *Server {
	s := &Server{svc: svc, key: apiKey, log: log, version: version, bodyIdle: BodyIdleTimeout, mux: http.NewServeMux(),
		idem: newIdemStore()}
	s.routes()
	return s
}

func (s *Server) routes() {
	m := s.mux
	s.handle("GET /healthz", http.HandlerFunc(s.health))
	s.handle("POST /v1/sandboxes", s.auth(s.create))
	s.handle("GET /v1/sandboxes", s.auth(s.list))
	s.handle("GET /v1/sandboxes/{id}", s.auth(s.get))
	s.handle("GET /v1/sandboxes/{id}/wait", s.auth(s.wait))
	s.handle("DELETE /v1/sandboxes/{id}", s.auth(s.delete))
	s.handle("POST /v1/sandboxes/{id}/run_code", s.auth(s.runCode))
	s.handle("POST /v1/sandboxes/{id}/exec", s.auth(s.exec))
	s.handle("POST /v1/sandboxes/{id}/interrupt", s.auth(s.interrupt))
	s.handle("GET /v1/sandboxes/{id}/files", s.auth(s.readFile))
	s.handle("PUT /v1/sandboxes/{id}/files", s.auth(s.writeFile))
	s.handle("DELETE /v1/sandboxes/{id}/files", s.auth(s.removeFile))
	s.handle("GET /v1/sandboxes/{id}/files/list", s.auth(s.listFiles))
	s.handle("GET /v1/sandboxes/{id}/files/stat", s.auth(s.statFile))
	s.handle("POST /v1/sandboxes/{id}/files/mkdir", s.auth(s.mkdir))
	s.handle("GET /v1/sandboxes/{id}/files/archive", s.auth(s.downloadArchive))
	s.handle("PUT /v1/sandboxes/{id}/files/archive", s.auth(s.uploadArchive))
	s.extraRoutes(m)
	s.ingressRoutes()
	s.templateRoutes()
	s.imageRoutes()
	s.observeRoutes()
	s.docRoutes(m)
}

// handle registers h for pattern on the mux and records the pattern.
func (s *Server) handle(pattern string, h http.Handler) {
	s.patterns = append(s.patterns, pattern)
	s.mux.Handle(pattern, h)
}

// ServeHTTP implements http.Handler. Requests no route matches get a JSON 404 or 405 like every other error.
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	start := time.Now()
	h, pattern := s.mux.Handler(r)
	if pattern == "" {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, r)
		for k, v := range rec.Header() {
			if k == "Allow" {
				w.Header()[k] = v
			}
		}
		msg := "no such route: " + r.Method + " " + r.URL.Path
		if rec.Code == http.StatusMethodNotAllowed {
			msg = "method " + r.Method + " not allowed on " + r.URL.Path
		}
		writeJSON(w, rec.Code, map[string]string{"error": msg})
		return
	}
	sw := &statusWriter{ResponseWriter: w, code: 200}
	if r.Body != nil && r.Body != http.NoBody {
		// Armed now, not at the first read: a handler that answers without reading (401, say) leaves the body to
		// the server, which discards it under the same deadline.
		rc := http.NewResponseController(w)
		if rc.SetReadDeadline(time.Now().Add(s.bodyIdle)) == nil {
			r.Body = &progressBody{ReadCloser: r.Body, rc: rc, idle: s.bodyIdle}
		}
	}
	s.mux.ServeHTTP(sw, r)
	s.observeRequest(pattern, sw.code, time.Since(start))
	s.log.Debug("request", "method", r.Method, "path", r.URL.Path, "status", sw.code, "ms", time.Since(start).Milliseconds())
}

type statusWriter struct {
	http.ResponseWriter
	code int
}

func (w *statusWriter) WriteHeader(c int) { w.code = c; w.ResponseWriter.WriteHeader(c) }
func (w *statusWriter) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}
func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// progressBody moves the connection's read deadline forward at every read of a request body, and clears it
// when the body ends: the deadline bounds a stall, not the whole upload. (A deadline left set after the body's
// end would fire in net/http's background read and cancel the request's context.)
type progressBody struct {
	io.ReadCloser
	rc   *http.ResponseController
	idle time.Duration
	done bool

	mu      sync.Mutex
	stopped bool // stop: the body is not read any further
}

func (b *progressBody) Read(p []byte) (int, error) {
	if b.done {
		return b.ReadCloser.Read(p)
	}
	b.mu.Lock()
	if b.stopped {
		b.mu.Unlock()
		return 0, errTransferStopped
	}
	b.rc.SetReadDeadline(time.Now().Add(b.idle)) //nolint:errcheck // supported: checked when armed
	b.mu.Unlock()
	n, err := b.ReadCloser.Read(p)
	if err == io.EOF {
		b.done = true
		b.rc.SetReadDeadline(time.Time{}) //nolint:errcheck // as above
	}
	if err != nil && errors.Is(err, os.ErrDeadlineExceeded) {
		b.done = true
		err = errBodyTimeout
	}
	return n, err
}

// stop ends the body's reading from another goroutine (a delete of the sandbox it is written to): a read under
// way fails at once, later ones at their start. The connection is not read again.
func (b *progressBody) stop() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.stopped = true
	b.rc.SetReadDeadline(time.Unix(1, 0)) //nolint:errcheck // as in Read
}

// errBodyTimeout is a request body that made no progress for the body idle timeout: 408.
var errBodyTimeout = errors.New("request body not received in time")

func (s *Server) auth(h http.HandlerFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		// Authorization: Bearer <key>, or X-Api-Key: <key> as the reference's examples send it.
		got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		if !ok {
			got = r.Header.Get("X-Api-Key")
			ok = got != ""
		}
		if !ok || subtle.ConstantTimeCompare([]byte(strings.TrimSpace(got)), []byte(s.key)) != 1 {
			writeError(w, errdefs.New(errdefs.ErrUnauthorized, "invalid api key"))
			return
		}
		if id := r.PathValue("id"); id != "" && !sandbox.ValidID(id) {
			writeError(w, errNotFound)
			return
		}
		if key, ok := idemKeyOf(r); ok {
			s.idem.serve(w, r, key, h)
			return
		}
		h(w, r)
	})
}

// statusOf maps the error taxonomy to HTTP statuses: the one place this happens.
func statusOf(err error) int {
	var mbe *http.MaxBytesError
	switch {
	case errors.Is(err, errdefs.ErrUnauthorized):
		return http.StatusUnauthorized
	case errors.Is(err, errBodyTimeout):
		return http.StatusRequestTimeout
	case errors.Is(err, errdefs.ErrNotFound):
		return http.StatusNotFound
	case errors.Is(err, errdefs.ErrTooLarge), errors.As(err, &mbe):
		return http.StatusRequestEntityTooLarge
	case errors.Is(err, errdefs.ErrInvalid):
		return http.StatusBadRequest
	case errors.Is(err, errdefs.ErrConflict):
		return http.StatusConflict
	case errors.Is(err, errIdemMismatch):
		return http.StatusUnprocessableEntity
	case errors.Is(err, errdefs.ErrUnavailable):
		return http.StatusServiceUnavailable
	case errors.Is(err, syscall.EDQUOT), errors.Is(err, syscall.ENOSPC):
		// A sandbox's disk quota (disk_mib) or the host's disk is full: nothing the server did wrong, and
		// nothing a retry changes until files are removed.
		return http.StatusInsufficientStorage
	}
	return http.StatusInternalServerError
}

func writeError(w http.ResponseWriter, err error) {
	code := statusOf(err)
	msg := errdefs.Message(err)
	var mbe *http.MaxBytesError
	if errors.As(err, &mbe) {
		msg = "request body too large"
	}
	if errors.Is(err, errBodyTimeout) {
		msg = errBodyTimeout.Error()
		w.Header().Set("Connection", "close")
	}
	writeJSON(w, code, map[string]string{"error": msg})
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	enc := json.NewEncoder(w)
	enc.Encode(v) //nolint:errcheck // the client went away
}

// decode reads a JSON body into v: size-limited, unknown fields refused, an empty body allowed when optional.
func decode(w http.ResponseWriter, r *http.Request, v any, optional bool) error {
	body := http.MaxBytesReader(w, r.Body, MaxJSONBody)
	dec := json.NewDecoder(body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		if errors.Is(err, io.EOF) && optional {
			return nil
		}
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) || errors.Is(err, errBodyTimeout) {
			return err
		}
		if errors.Is(err, io.EOF) {
			return errdefs.New(errdefs.ErrInvalid, "request body must be a JSON object")
		}
		// DisallowUnknownFields: the field is the message ("unknown field \"bogus\""), not a syntax error.
		if field, ok := strings.CutPrefix(err.Error(), "json: unknown field "); ok {
			return errdefs.New(errdefs.ErrInvalid, "unknown field "+field)
		}
		// Well-formed JSON with a value of the wrong type: name the field and the type it needs.
		var ute *json.UnmarshalTypeError
		if errors.As(err, &ute) {
			if ute.Field == "" {
				return errdefs.New(errdefs.ErrInvalid, "request body must be a JSON object, not "+ute.Value)
			}
			return errdefs.New(errdefs.ErrInvalid, fmt.Sprintf("%s: expected %s, got %s", ute.Field, jsonTypeName(ute.Type), ute.Value))
		}
		return errdefs.New(errdefs.ErrInvalid, "malformed JSON: "+err.Error())
	}
	if dec.More() {
		return errdefs.New(errdefs.ErrInvalid, "malformed JSON: trailing data after the object")
	}
	return nil
}

// jsonTypeName names the JSON type a Go type decodes from, for error messages.
func jsonTypeName(t reflect.Type) string {
	switch t.Kind() {
	case reflect.String:
		return "a string"
	case reflect.Bool:
		return "a boolean"
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		return "an integer"
	case reflect.Float32, reflect.Float64:
		return "a number"
	case reflect.Slice, reflect.Array:
		return "an array"
	case reflect.Map, reflect.Struct:
		return "an object"
	case reflect.Pointer:
		return jsonTypeName(t.Elem())
	}
	return "a " + t.String()
}

func (s *Server) health(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, 200, map[string]string{"status": "ok", "version": s.version})
}
