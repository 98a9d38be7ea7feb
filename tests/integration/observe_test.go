package integration

import (
	"bufio"
	"context"
	"encoding/json"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/ramify-dev/ramify/client"
	"github.com/ramify-dev/ramify/internal/testserver"
)

// follow streams events into a channel until the test ends.
func follow(t *testing.T, s *testserver.Server, o client.EventsOptions) <-chan client.LifecycleEvent {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	ch := make(chan client.LifecycleEvent, 100)
	done := make(chan struct{})
	t.Cleanup(func() { cancel(); <-done })
	go func() {
		defer close(done)
		s.Client.Events(ctx, o, func(e client.LifecycleEvent) error { ch <- e; return nil }) //nolint:errcheck // ends with the test
	}()
	return ch
}

// next returns the next event, failing the test if none comes in 60 s (a hang, not a timing assertion).
func next(t *testing.T, ch <-chan client.LifecycleEvent) client.LifecycleEvent {
	t.Helper()
	select {
	case e := <-ch:
		return e
	case <-time.After(60 * time.Second):
		t.Fatal("no event within 60 s")
	}
	return client.LifecycleEvent{}
}

// A follower of /v1/events sees a fork family's life in order, a follower that resumes with Last-Event-ID gets
// exactly what came after, and one whose id is unknown is told that it missed events.
func TestEventsFollowForkAndMerge(t *testing.T) {
	s := testserver.Start(t, "--warm-pool", "0")
	ctx := ctxT(t)
	parent := create(t, s, nil)
	info, _ := s.Client.Get(ctx, parent)
	// After an id this server never gave: a missed event, then the history (so nothing that happens after the
	// follower starts can slip past it before its stream is open).
	fam := follow(t, s, client.EventsOptions{Family: info.FamilyID, After: 1})
	if e := next(t, fam); e.Type != "missed" || e.After != 1 || e.ID != 0 {
		t.Fatalf("first event: %+v", e)
	}
	if e := next(t, fam); e.Type != "created" || e.Sandbox != parent || e.Status != "running" {
		t.Fatalf("created event: %+v", e)
	}
	kids, err := s.Client.Fork(ctx, parent, 2)
	if err != nil {
		t.Fatal(err)
	}
	forked := next(t, fam)
	if forked.Type != "forked" || forked.Sandbox != parent || !slices.Equal(forked.Children, kids) || forked.N != 2 ||
		forked.Family != info.FamilyID || forked.ID == 0 || forked.Time.IsZero() {
		t.Fatalf("forked event: %+v", forked)
	}
	if _, err := s.Client.Diff(ctx, parent, kids[0], nil); err != nil {
		t.Fatal(err)
	}
	if err := s.Client.MergeInto(ctx, parent, kids[0]); err != nil {
		t.Fatal(err)
	}
	if err := s.Client.Delete(ctx, kids[1]); err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, want := range []string{"diffed", "merged", "destroyed"} {
		e := next(t, fam)
		got = append(got, e.Type)
		if e.Type != want {
			t.Fatalf("events after forked: %v, want diffed, merged, destroyed", got)
		}
		switch e.Type {
		case "merged":
			if e.Sandbox != parent || e.Winner != kids[0] {
				t.Errorf("merged: %+v", e)
			}
		case "destroyed":
			if e.Sandbox != kids[1] || e.Reason != "deleted" {
				t.Errorf("destroyed: %+v", e)
			}
		}
	}

	// Resume after the forked event: the same three, from the history, then nothing else of this family.
	rctx, cancel := context.WithCancel(ctx)
	var resumed []client.LifecycleEvent
	err = s.Client.Events(rctx, client.EventsOptions{Family: info.FamilyID, After: forked.ID}, func(e client.LifecycleEvent) error {
		resumed = append(resumed, e)
		if len(resumed) == 3 {
			cancel()
		}
		return nil
	})
	if err != context.Canceled || len(resumed) != 3 || resumed[0].ID <= forked.ID || resumed[0].Type != "diffed" || resumed[2].Type != "destroyed" {
		t.Fatalf("resumed after %d: %+v (%v)", forked.ID, resumed, err)
	}

	// A Last-Event-ID this server never gave (from an earlier run): a missed event, then the history.
	req, _ := http.NewRequestWithContext(ctx, "GET", s.URL+"/v1/events?sandbox="+kids[1], nil)
	req.Header.Set("Authorization", "Bearer "+s.Key)
	req.Header.Set("Last-Event-ID", "5")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if ct := resp.Header.Get("Content-Type"); resp.StatusCode != 200 || ct != "text/event-stream" {
		t.Fatalf("status %d, content type %q", resp.StatusCode, ct)
	}
	var types []string
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() && len(types) < 3 {
		if v, ok := strings.CutPrefix(sc.Text(), "event: "); ok {
			types = append(types, v)
		}
	}
	if !slices.Equal(types, []string{"missed", "forked", "destroyed"}) { // the events that mention kids[1]
		t.Fatalf("with an unknown Last-Event-ID: %v", types)
	}

	code, body := raw(t, s, "GET", "/v1/events?sandbox=nope", s.Key, nil)
	wantError(t, code, body, 400, "sandbox must be a sandbox id")
	code, body = raw(t, s, "GET", "/v1/events", "", nil)
	wantError(t, code, body, 401, "")
}

// scrapeMetrics gets url (with key when set) and parses it as Prometheus does.
func scrapeMetrics(t *testing.T, url, key string) map[string]*dto.MetricFamily {
	t.Helper()
	req, _ := http.NewRequest("GET", url, nil)
	if key != "" {
		req.Header.Set("Authorization", "Bearer "+key)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("GET %s: status %d", url, resp.StatusCode)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("parse %s: %v", url, err)
	}
	return fams
}

func metric(fams map[string]*dto.MetricFamily, name, label, value string) *dto.Metric {
	for _, m := range fams[name].GetMetric() {
		for _, l := range m.GetLabel() {
			if l.GetName() == label && l.GetValue() == value {
				return m
			}
		}
		if label == "" {
			return m
		}
	}
	return nil
}

// GET /metrics answers the Prometheus text format with the API key, and without one on --metrics-listen.
func TestMetricsScrape(t *testing.T) {
	s := testserver.Start(t, "--warm-pool", "1", "--metrics-listen", "127.0.0.1:0", "--metrics-per-sandbox", "5")
	ctx := ctxT(t)
	a := create(t, s, nil)
	run(t, s, a, "x = bytearray(20 << 20)")
	sh(t, s, a, "true")
	kids := s.Fork(t, a, 2)
	if _, err := s.Client.Exec(ctx, "sbx_00000000000000000000000000", client.ExecRequest{Cmd: "true"}); err == nil {
		t.Fatal("exec in an unknown sandbox worked")
	}
	if err := s.Client.Delete(ctx, kids[1]); err != nil {
		t.Fatal(err)
	}

	code, body := raw(t, s, "GET", "/metrics", "", nil)
	wantError(t, code, body, 401, "")
	fams := scrapeMetrics(t, s.URL+"/metrics", s.Key)
	if m := metric(fams, "ramify_sandboxes", "status", "running"); m.GetGauge().GetValue() != 2 {
		t.Errorf("ramify_sandboxes{status=running} = %v, want 2 (a and one child)", m)
	}
	for _, op := range []string{"create", "fork", "run_code", "exec", "delete"} {
		if m := metric(fams, "ramify_operation_duration_seconds", "op", op); m.GetHistogram().GetSampleCount() < 1 {
			t.Errorf("no %s observed: %v", op, m)
		}
	}
	if m := metric(fams, "ramify_operation_errors_total", "op", "exec"); m == nil || m.GetCounter().GetValue() != 1 ||
		!slices.ContainsFunc(m.GetLabel(), func(l *dto.LabelPair) bool { return l.GetName() == "code" && l.GetValue() == "404" }) {
		t.Errorf("exec errors: %v", m)
	}
	if m := metric(fams, "ramify_fork_children", "", ""); m.GetHistogram().GetSampleSum() != 2 {
		t.Errorf("fork children: %v", m)
	}
	if m := metric(fams, "ramify_fork_parent_pause_seconds", "", ""); m.GetHistogram().GetSampleCount() != 1 {
		t.Errorf("parent pause: %v", m)
	}
	if m := metric(fams, "ramify_sandbox_memory_bytes", "sandbox", a); m.GetGauge().GetValue() < 20<<20 {
		t.Errorf("memory of %s: %v (it holds a 20 MiB bytearray)", a, m)
	}
	if m := metric(fams, "ramify_sandbox_memory_bytes", "sandbox", kids[1]); m != nil {
		t.Errorf("a deleted sandbox still has series: %v", m)
	}
	if metric(fams, "ramify_warm_pool_target", "", "").GetGauge().GetValue() != 1 || fams["go_goroutines"] == nil {
		t.Errorf("warm pool target or Go runtime metrics missing")
	}

	// The same without a key on --metrics-listen (its address is in the server's log).
	addr := regexp.MustCompile(`metrics \(no auth\) on (http://\S+/metrics)`).FindStringSubmatch(s.Log())
	if addr == nil {
		t.Fatalf("no metrics address in the log:\n%s", s.Log())
	}
	open := scrapeMetrics(t, addr[1], "")
	if m := metric(open, "ramify_sandboxes", "status", "running"); m.GetGauge().GetValue() != 2 {
		t.Errorf("unauthenticated scrape: %v", m)
	}
}

// GET /v1/sandboxes/{id}/logs answers the sandbox's recent log lines (a list, possibly empty) and 404 for an
// unknown id.
func TestSandboxLogsRoute(t *testing.T) {
	s := testserver.Start(t, "--warm-pool", "0")
	a := create(t, s, nil)
	lines, err := s.Client.Logs(ctxT(t), a)
	if err != nil || lines == nil {
		t.Fatalf("logs: %v %v", lines, err)
	}
	code, body := raw(t, s, "GET", "/v1/sandboxes/sbx_00000000000000000000000000/logs", s.Key, nil)
	wantError(t, code, body, 404, "")
	b, _ := json.Marshal(lines)
	t.Logf("lines: %s", b)
}
