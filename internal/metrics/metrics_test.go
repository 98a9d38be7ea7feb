package metrics

import (
	"net/http/httptest"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/ramify-dev/ramify/internal/events"
	"github.com/ramify-dev/ramify/internal/sandbox"
)

type fakeSource struct{ usages []sandbox.SandboxUsage }

func (fakeSource) Stats() sandbox.Stats {
	return sandbox.Stats{Sandboxes: map[sandbox.Status]int{sandbox.StatusRunning: 3, sandbox.StatusPaused: 1}, Warm: 1, WarmTarget: 2}
}

func (f fakeSource) Usages(limit int) []sandbox.SandboxUsage {
	return f.usages[:min(limit, len(f.usages))]
}

// scrape serves the metrics over HTTP and parses them as Prometheus does.
func scrape(t *testing.T, m *Metrics) map[string]*dto.MetricFamily {
	t.Helper()
	srv := httptest.NewServer(m.Handler())
	defer srv.Close()
	resp, err := srv.Client().Get(srv.URL)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return fams
}

func value(t *testing.T, fams map[string]*dto.MetricFamily, name string, labels map[string]string) *dto.Metric {
	t.Helper()
	f := fams[name]
	if f == nil {
		t.Fatalf("no metric %s", name)
	}
next:
	for _, m := range f.Metric {
		for k, v := range labels {
			found := false
			for _, l := range m.Label {
				if l.GetName() == k && l.GetValue() == v {
					found = true
				}
			}
			if !found {
				continue next
			}
		}
		return m
	}
	t.Fatalf("no %s%v", name, labels)
	return nil
}

func TestGaugesComeFromTheService(t *testing.T) {
	disk := int64(4096)
	src := fakeSource{usages: []sandbox.SandboxUsage{
		{ID: "sbx_a", Family: "fam_a", Usage: sandbox.UsageInfo{MemBytes: 100, CPUSeconds: 1.5, Pids: 3, DiskBytes: &disk}},
		{ID: "sbx_b", Family: "fam_a", Usage: sandbox.UsageInfo{MemBytes: 200}},
	}}
	fams := scrape(t, New(src, Options{PerSandbox: 1}))
	if v := value(t, fams, "ramify_sandboxes", map[string]string{"status": "running"}).GetGauge().GetValue(); v != 3 {
		t.Errorf("running = %v", v)
	}
	if v := value(t, fams, "ramify_sandboxes", map[string]string{"status": "error"}).GetGauge().GetValue(); v != 0 {
		t.Errorf("error = %v", v)
	}
	if v := value(t, fams, "ramify_warm_pool_ready", nil).GetGauge().GetValue(); v != 1 {
		t.Errorf("warm = %v", v)
	}
	if v := value(t, fams, "ramify_sandbox_cpu_seconds_total", map[string]string{"sandbox": "sbx_a"}).GetCounter().GetValue(); v != 1.5 {
		t.Errorf("cpu = %v", v)
	}
	if n := len(fams["ramify_sandbox_memory_bytes"].Metric); n != 1 {
		t.Errorf("per-sandbox series capped at 1, got %d", n)
	}
	for _, name := range []string{"go_goroutines", "process_resident_memory_bytes", "ramify_operation_duration_seconds"} {
		if fams[name] == nil {
			t.Errorf("no %s", name)
		}
	}
	// Off by default: no per-sandbox series at all.
	if fams := scrape(t, New(src, Options{})); fams["ramify_sandbox_memory_bytes"] != nil {
		t.Error("per-sandbox series without --metrics-per-sandbox")
	}
}

func TestEventsAndRequestsFeedTheHistograms(t *testing.T) {
	m := New(fakeSource{}, Options{})
	hub := events.New(0)
	m.Watch(hub)
	hub.Publish(events.Event{Type: events.Forked, Status: "running", N: 3, PauseMs: 2})
	hub.Publish(events.Event{Type: events.Paused, Ms: 1500, Bytes: 5 << 20})
	hub.Publish(events.Event{Type: events.PauseFailed})
	m.ObserveRequest("run_code", 200, 20*time.Millisecond)
	m.ObserveRequest("fork", 409, time.Millisecond)
	m.ObserveRequest("pause", 202, time.Millisecond) // its duration comes from its event
	fams := scrape(t, m)
	if h := value(t, fams, "ramify_fork_children", nil).GetHistogram(); h.GetSampleCount() != 1 || h.GetSampleSum() != 3 {
		t.Errorf("fork children %v", h)
	}
	if h := value(t, fams, "ramify_fork_parent_pause_seconds", nil).GetHistogram(); h.GetSampleSum() != 0.002 {
		t.Errorf("parent pause %v", h)
	}
	if h := value(t, fams, "ramify_operation_duration_seconds", map[string]string{"op": "pause"}).GetHistogram(); h.GetSampleCount() != 1 || h.GetSampleSum() != 1.5 {
		t.Errorf("pause %v", h)
	}
	if h := value(t, fams, "ramify_snapshot_bytes", map[string]string{"op": "pause"}).GetHistogram(); h.GetSampleSum() != 5<<20 {
		t.Errorf("snapshot bytes %v", h)
	}
	if h := value(t, fams, "ramify_operation_duration_seconds", map[string]string{"op": "run_code"}).GetHistogram(); h.GetSampleCount() != 1 {
		t.Errorf("run_code %v", h)
	}
	if c := value(t, fams, "ramify_operation_errors_total", map[string]string{"op": "fork", "code": "409"}).GetCounter(); c.GetValue() != 1 {
		t.Errorf("fork errors %v", c)
	}
	if c := value(t, fams, "ramify_operation_errors_total", map[string]string{"op": "pause", "code": "failed"}).GetCounter(); c.GetValue() != 1 {
		t.Errorf("pause failures %v", c)
	}
	if c := value(t, fams, "ramify_events_total", map[string]string{"type": "forked"}).GetCounter(); c.GetValue() != 1 {
		t.Errorf("events %v", c)
	}
}
