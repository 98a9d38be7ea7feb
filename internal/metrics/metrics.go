// Package metrics owns ramify's Prometheus metrics: their names, labels and buckets, the registry GET /metrics
// serves, the gauges read from the sandbox service at scrape time (sandboxes by status, the warm pool, and, opt-in
// and capped, each running sandbox's CPU, memory, tasks and disk), the histograms fed by lifecycle events (pause,
// resume, fork fan-out and parent pause) and by the API (operation durations and errors), and the Go runtime's
// and process's metrics. docs/observability.md lists every name.
package metrics

import (
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/ramify-dev/ramify/internal/events"
	"github.com/ramify-dev/ramify/internal/sandbox"
)

// Ops are the values of the op label.
var Ops = []string{"create", "fork", "merge", "diff", "pause", "resume", "run_code", "exec", "files", "delete"}

// Source is what the metrics read from the sandbox service at each scrape.
type Source interface {
	Stats() sandbox.Stats
	Usages(limit int) []sandbox.SandboxUsage
}

// Metrics is ramify's metric set and its registry.
type Metrics struct {
	reg        *prometheus.Registry
	opSeconds  *prometheus.HistogramVec
	opErrors   *prometheus.CounterVec
	forkN      prometheus.Histogram
	forkPause  prometheus.Histogram
	snapBytes  *prometheus.HistogramVec
	eventCount *prometheus.CounterVec
}

// Options configures New.
type Options struct {
	// PerSandbox is how many running sandboxes get series of their own (the most recently created first); 0
	// turns per-sandbox series off. It bounds their cardinality: 4 series per sandbox.
	PerSandbox int
}

// New registers every metric, reading gauges from src at scrape time.
func New(src Source, o Options) *Metrics {
	m := &Metrics{reg: prometheus.NewRegistry()}
	m.opSeconds = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "ramify_operation_duration_seconds",
		Help:    "How long operations took: for pause and resume the background work, for the others the API call.",
		Buckets: []float64{.001, .0025, .005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300},
	}, []string{"op"})
	m.opErrors = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "ramify_operation_errors_total",
		Help: "Operations that failed, by HTTP status code (\"failed\": a pause or resume that failed in the background).",
	}, []string{"op", "code"})
	m.forkN = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "ramify_fork_children",
		Help:    "Fork fan-out: children per fork.",
		Buckets: []float64{1, 2, 4, 8, 16, 32},
	})
	m.forkPause = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name:    "ramify_fork_parent_pause_seconds",
		Help:    "How long a fork froze its parent.",
		Buckets: []float64{.0005, .001, .0025, .005, .01, .025, .05, .1, .25, 1},
	})
	m.snapBytes = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name:    "ramify_snapshot_bytes",
		Help:    "Size of the snapshots pauses wrote (op=pause) and resumes read (op=resume).",
		Buckets: prometheus.ExponentialBuckets(1<<20, 4, 10), // 1 MiB .. 256 GiB
	}, []string{"op"})
	m.eventCount = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "ramify_events_total",
		Help: "Lifecycle events published, by type.",
	}, []string{"type"})
	for _, op := range Ops {
		m.opSeconds.WithLabelValues(op) // present from the start, at 0
	}
	m.reg.MustRegister(m.opSeconds, m.opErrors, m.forkN, m.forkPause, m.snapBytes, m.eventCount,
		&sourceCollector{src: src, perSandbox: o.PerSandbox},
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	return m
}

// Registry is the registry the metrics are in.
func (m *Metrics) Registry() *prometheus.Registry { return m.reg }

// Handler serves the metrics in the Prometheus text format (or OpenMetrics, when asked for).
func (m *Metrics) Handler() http.Handler {
	return promhttp.HandlerFor(m.reg, promhttp.HandlerOpts{})
}

// Watch feeds the event-driven metrics from hub.
func (m *Metrics) Watch(hub *events.Hub) { hub.Watch(m.observeEvent) }

func (m *Metrics) observeEvent(e events.Event) {
	m.eventCount.WithLabelValues(e.Type).Inc()
	switch e.Type {
	case events.Forked:
		m.forkN.Observe(float64(e.N))
		if e.Status == string(sandbox.StatusRunning) { // a fork of a paused sandbox freezes nothing
			m.forkPause.Observe(e.PauseMs / 1000)
		}
	case events.Paused:
		m.opSeconds.WithLabelValues("pause").Observe(e.Ms / 1000)
		m.snapBytes.WithLabelValues("pause").Observe(float64(e.Bytes))
	case events.Resumed:
		m.opSeconds.WithLabelValues("resume").Observe(e.Ms / 1000)
		m.snapBytes.WithLabelValues("resume").Observe(float64(e.Bytes))
	case events.PauseFailed:
		m.opErrors.WithLabelValues("pause", "failed").Inc()
	case events.ResumeFailed: // the sandbox is paused again, its snapshot kept
		m.opErrors.WithLabelValues("resume", "failed").Inc()
	case events.Error:
		if strings.HasPrefix(e.Error, "resume failed") { // set by the service when a resume fails
			m.opErrors.WithLabelValues("resume", "failed").Inc()
		}
	}
}

// ObserveRequest records one API call of op that answered status after d. Pause and resume calls only count
// their errors: their duration is the background work's, recorded from their events.
func (m *Metrics) ObserveRequest(op string, status int, d time.Duration) {
	if m == nil || op == "" {
		return
	}
	if status >= 400 {
		m.opErrors.WithLabelValues(op, strconv.Itoa(status)).Inc()
		return
	}
	if op != "pause" && op != "resume" {
		m.opSeconds.WithLabelValues(op).Observe(d.Seconds())
	}
}

// sourceCollector reads the service's gauges at scrape time.
type sourceCollector struct {
	src        Source
	perSandbox int
}

var (
	descSandboxes  = prometheus.NewDesc("ramify_sandboxes", "Sandboxes by status (the warm pool not counted).", []string{"status"}, nil)
	descWarm       = prometheus.NewDesc("ramify_warm_pool_ready", "Pre-started sandboxes ready for create.", nil, nil)
	descWarmTarget = prometheus.NewDesc("ramify_warm_pool_target", "Pre-started sandboxes the warm pool keeps (--warm-pool).", nil, nil)
	descAhead      = prometheus.NewDesc("ramify_fork_ahead_ready", "Children made ahead of forks, ready for the next fork of their parent.", nil, nil)
	descAheadLimit = prometheus.NewDesc("ramify_fork_ahead_limit", "The most children made ahead of forks at once (--fork-ahead).", nil, nil)
	descAheadTotal = prometheus.NewDesc("ramify_fork_ahead_children_total", "Children made ahead of forks, by what became of them: made, used by a fork, dropped unused.", []string{"outcome"}, nil)
	sbLabels       = []string{"sandbox", "family"}
	descMem        = prometheus.NewDesc("ramify_sandbox_memory_bytes", "A running sandbox's memory use (its cgroup).", sbLabels, nil)
	descCPU        = prometheus.NewDesc("ramify_sandbox_cpu_seconds_total", "A running sandbox's CPU time (a fork child: since the fork).", sbLabels, nil)
	descPids       = prometheus.NewDesc("ramify_sandbox_tasks", "A running sandbox's processes and threads.", sbLabels, nil)
	descDisk       = prometheus.NewDesc("ramify_sandbox_disk_bytes", "What a running sandbox's files count against its disk_mib (absent without per-sandbox accounting).", sbLabels, nil)
	descShown      = prometheus.NewDesc("ramify_sandbox_series_limit", "How many running sandboxes get per-sandbox series (--metrics-per-sandbox; 0: off).", nil, nil)
)

// statuses are the ones ramify_sandboxes always reports, 0 included.
var statuses = []sandbox.Status{sandbox.StatusCreating, sandbox.StatusRunning, sandbox.StatusPausing, sandbox.StatusPaused,
	sandbox.StatusResuming, sandbox.StatusError}

func (c *sourceCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descSandboxes, descWarm, descWarmTarget, descAhead, descAheadLimit, descAheadTotal, descMem, descCPU, descPids, descDisk, descShown} {
		ch <- d
	}
}

func (c *sourceCollector) Collect(ch chan<- prometheus.Metric) {
	st := c.src.Stats()
	for _, s := range statuses {
		ch <- prometheus.MustNewConstMetric(descSandboxes, prometheus.GaugeValue, float64(st.Sandboxes[s]), string(s))
	}
	ch <- prometheus.MustNewConstMetric(descWarm, prometheus.GaugeValue, float64(st.Warm))
	ch <- prometheus.MustNewConstMetric(descWarmTarget, prometheus.GaugeValue, float64(st.WarmTarget))
	ch <- prometheus.MustNewConstMetric(descAhead, prometheus.GaugeValue, float64(st.Ahead))
	ch <- prometheus.MustNewConstMetric(descAheadLimit, prometheus.GaugeValue, float64(st.AheadLimit))
	for outcome, n := range map[string]int64{"made": st.AheadMade, "used": st.AheadUsed, "dropped": st.AheadDropped} {
		ch <- prometheus.MustNewConstMetric(descAheadTotal, prometheus.CounterValue, float64(n), outcome)
	}
	ch <- prometheus.MustNewConstMetric(descShown, prometheus.GaugeValue, float64(c.perSandbox))
	for _, u := range c.src.Usages(c.perSandbox) {
		ch <- prometheus.MustNewConstMetric(descMem, prometheus.GaugeValue, float64(u.Usage.MemBytes), u.ID, u.Family)
		ch <- prometheus.MustNewConstMetric(descCPU, prometheus.CounterValue, u.Usage.CPUSeconds, u.ID, u.Family)
		ch <- prometheus.MustNewConstMetric(descPids, prometheus.GaugeValue, float64(u.Usage.Pids), u.ID, u.Family)
		if u.Usage.DiskBytes != nil {
			ch <- prometheus.MustNewConstMetric(descDisk, prometheus.GaugeValue, float64(*u.Usage.DiskBytes), u.ID, u.Family)
		}
	}
}
