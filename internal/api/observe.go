package api

import (
	"context"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/ramify-dev/ramify/internal/errdefs"
	"github.com/ramify-dev/ramify/internal/events"
	"github.com/ramify-dev/ramify/internal/metrics"
	"github.com/ramify-dev/ramify/internal/sandbox"
)

// Observability is what the API serves to watch the server: GET /v1/events, GET /metrics and per-sandbox logs.
// Either part may be nil (then its route answers 404 saying it is off).
type Observability struct {
	Events  *events.Hub
	Metrics *metrics.Metrics
}

// observer is the Server's observability state.
type observer struct {
	Observability
	streams context.Context // ends every event stream (CloseStreams)
	close   context.CancelFunc
}

// Observe wires the event stream and the metrics in; call it before serving.
func (s *Server) Observe(o Observability) {
	s.obs.Observability = o
}

// CloseStreams ends the event streams being served (they would hold http.Server.Shutdown for their whole
// timeout): register it with http.Server.RegisterOnShutdown. Followers reconnect to the next server with their
// Last-Event-ID.
func (s *Server) CloseStreams() { s.obs.close() }

func (s *Server) observeRoutes() {
	s.obs.streams, s.obs.close = context.WithCancel(context.Background())
	s.handle("GET /metrics", s.auth(s.metrics))
	s.handle("GET /v1/events", s.auth(s.events))
	s.handle("GET /v1/sandboxes/{id}/logs", s.auth(s.logs))
}

// opOf names the operation a route pattern serves, for the metrics ("" for the others).
func opOf(pattern string) string {
	switch {
	case pattern == "POST /v1/sandboxes":
		return "create"
	case pattern == "DELETE /v1/sandboxes/{id}":
		return "delete"
	case strings.Contains(pattern, "/files"):
		return "files"
	}
	for _, op := range []string{"fork", "merge_into", "diff", "pause", "resume", "run_code", "exec"} {
		if strings.HasPrefix(pattern, "POST /v1/sandboxes/{id}/"+op) || strings.HasPrefix(pattern, "GET /v1/sandboxes/{id}/"+op) {
			return strings.TrimSuffix(op, "_into")
		}
	}
	return ""
}

// observeRequest records a finished API call in the metrics.
func (s *Server) observeRequest(pattern string, status int, d time.Duration) {
	s.obs.Metrics.ObserveRequest(opOf(pattern), status, d)
}

// MetricsHandler serves the metrics without authentication (for --metrics-listen), or nil when metrics are off.
func (s *Server) MetricsHandler() http.Handler {
	if s.obs.Metrics == nil {
		return nil
	}
	return s.obs.Metrics.Handler()
}

func (s *Server) metrics(w http.ResponseWriter, r *http.Request) {
	if s.obs.Metrics == nil {
		writeError(w, errdefs.New(errdefs.ErrNotFound, "metrics are off on this server"))
		return
	}
	s.obs.Metrics.Handler().ServeHTTP(w, r)
}

// events streams lifecycle events as server-sent events: from the one after Last-Event-ID (header, or the
// last_event_id query parameter for clients that cannot set headers) out of the history, else from now on.
func (s *Server) events(w http.ResponseWriter, r *http.Request) {
	hub := s.obs.Events
	if hub == nil {
		writeError(w, errdefs.New(errdefs.ErrNotFound, "the event stream is off on this server"))
		return
	}
	q := r.URL.Query()
	f := events.Filter{Sandbox: q.Get("sandbox"), Family: q.Get("family")}
	if f.Sandbox != "" && !sandbox.ValidID(f.Sandbox) {
		writeError(w, errdefs.New(errdefs.ErrInvalid, fmt.Sprintf("sandbox must be a sandbox id, not %q", f.Sandbox)))
		return
	}
	last := r.Header.Get("Last-Event-ID")
	if last == "" {
		last = q.Get("last_event_id")
	}
	var after uint64
	if last != "" {
		n, err := strconv.ParseUint(last, 10, 64)
		if err != nil || n == 0 {
			writeError(w, errdefs.New(errdefs.ErrInvalid, fmt.Sprintf("Last-Event-ID must be an event id, not %q", last)))
			return
		}
		after = n
	}
	rc := http.NewResponseController(w)
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	// The first line tells the client the stream is open (and, on a retry, how long to wait: 1 s).
	fmt.Fprint(w, "retry: 1000\n: ramify events\n\n")
	if rc.Flush() != nil {
		return
	}
	ctx, cancel := context.WithCancel(r.Context())
	defer cancel()
	stop := context.AfterFunc(s.obs.streams, cancel)
	defer stop()
	hub.Follow(ctx, after, f, func(e events.Event) error { //nolint:errcheck // ends when the client goes or the server stops
		if err := events.WriteSSE(w, e); err != nil {
			return err
		}
		return rc.Flush()
	}, func() error {
		if _, err := fmt.Fprint(w, ": keepalive\n\n"); err != nil {
			return err
		}
		return rc.Flush()
	})
}

// logs answers a sandbox's recent agent log lines as text, oldest first.
func (s *Server) logs(w http.ResponseWriter, r *http.Request) {
	lines, err := s.svc.Logs(r.Context(), r.PathValue("id"))
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"lines": lines})
}
