package main

import (
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"time"

	"github.com/ramify-dev/ramify/internal/api"
	"github.com/ramify-dev/ramify/internal/events"
	"github.com/ramify-dev/ramify/internal/metrics"
	"github.com/ramify-dev/ramify/internal/sandbox"
)

// observeFlags are serve's flags for metrics and events.
type observeFlags struct {
	metricsListen string
	perSandbox    int
	eventHistory  int
}

func (o *observeFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&o.metricsListen, "metrics-listen", os.Getenv("RAMIFY_METRICS_LISTEN"),
		"also serve GET /metrics without authentication on this address, for a Prometheus scraper (env RAMIFY_METRICS_LISTEN)")
	fs.IntVar(&o.perSandbox, "metrics-per-sandbox", envInt("RAMIFY_METRICS_PER_SANDBOX", 0),
		"give this many running sandboxes (the newest) their own CPU, memory, task and disk series; 0: none (env RAMIFY_METRICS_PER_SANDBOX)")
	fs.IntVar(&o.eventHistory, "event-history", envInt("RAMIFY_EVENT_HISTORY", events.DefaultHistory),
		"lifecycle events kept for followers of GET /v1/events that reconnect with Last-Event-ID (env RAMIFY_EVENT_HISTORY)")
}

func (o *observeFlags) validate() error {
	if o.perSandbox < 0 || o.perSandbox > 10000 {
		return fmt.Errorf("--metrics-per-sandbox must be between 0 and 10000")
	}
	if o.eventHistory < 1 || o.eventHistory > 1_000_000 {
		return fmt.Errorf("--event-history must be between 1 and 1000000")
	}
	return nil
}

// wire makes the metrics (reading svc) and connects them to hub and the API server.
func (o *observeFlags) wire(svc *sandbox.Service, hub *events.Hub, srv *api.Server) {
	m := metrics.New(svc, metrics.Options{PerSandbox: o.perSandbox})
	m.Watch(hub)
	srv.Observe(api.Observability{Events: hub, Metrics: m})
}

// serveMetrics serves GET /metrics without authentication on --metrics-listen, if set; the returned function
// stops it.
func (o *observeFlags) serveMetrics(srv *api.Server, log *slog.Logger) (func(), error) {
	if o.metricsListen == "" {
		return func() {}, nil
	}
	ln, err := net.Listen("tcp", o.metricsListen)
	if err != nil {
		return nil, fmt.Errorf("--metrics-listen: %w", err)
	}
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", srv.MetricsHandler())
	hs := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		if err := hs.Serve(ln); err != nil && err != http.ErrServerClosed {
			log.Error("metrics listener", "err", err)
		}
	}()
	fmt.Fprintf(os.Stderr, "metrics (no auth) on http://%s/metrics\n", ln.Addr())
	return func() { hs.Close() }, nil
}
