package bench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ramify-dev/ramify/client"
	"github.com/ramify-dev/ramify/internal/testserver"
)

// BenchmarkDensity fills one server with idle sandboxes of the default shape, in steps, and at each step measures
// what a user of the host would feel: create (no warm pool), run_code 1+1 and fork n=1 of a probe sandbox, beside
// their figures on the idle server; and what each idle sandbox costs the host (MemAvailable drop per sandbox, the
// server's own memory). It stops at RAMIFY_BENCH_DENSITY_N sandboxes (default 1000), or earlier when a create fails
// (the error says what limits density) or the host has less than 1 GiB available. It also times 50 concurrent
// creates on the idle server (p50, p99, throughput).
//
// Capacity checks are raised (--cpu-overcommit, --mem-overcommit) so that the host, not the server's accounting,
// is what is measured: 1,000 sandboxes of the default shape (1 vCPU, 1 GiB) promise far more than 2 cores and
// 24 GiB, as idle sandboxes do.
//
//	make bench BENCH=Density
func BenchmarkDensity(b *testing.B) {
	target := 1000
	if v, err := strconv.Atoi(os.Getenv("RAMIFY_BENCH_DENSITY_N")); err == nil && v > 0 {
		target = v
	}
	// A /20 (the test server's own /24 holds 253 sandboxes).
	s := testserver.Start(b, "--warm-pool", "0", "--cpu-overcommit", "100000", "--mem-overcommit", "100000",
		"--subnet", "10.96.0.0/20")
	c := s.Client
	ctx := context.Background()
	out := &strings.Builder{}
	p := func(format string, a ...any) { fmt.Fprintf(out, format+"\n", a...) }
	defer func() { fmt.Print(out.String()) }()

	probe := must(c.Create(ctx, client.CreateRequest{})).ID
	must(c.RunCode(ctx, probe, client.RunCodeRequest{Code: "x = list(range(100000))"}))
	// measure times create, run_code and fork n=1 of the probe; a call that fails ends the measure with its error.
	measure := func() (create, run, fork time.Duration, err error) {
		try := func(f func() error) func() {
			return func() {
				if err == nil {
					err = f()
				}
			}
		}
		cs := timeIt(5, try(func() error {
			sb, err := c.Create(ctx, client.CreateRequest{})
			if err == nil {
				c.Delete(ctx, sb.ID) //nolint:errcheck
			}
			return err
		}))
		rs := timeIt(30, try(func() error {
			_, err := c.RunCode(ctx, probe, client.RunCodeRequest{Code: "1+1"})
			return err
		}))
		fs := timeIt(5, try(func() error {
			kids, err := c.Fork(ctx, probe, 1)
			if err == nil {
				_, err = c.RunCode(ctx, kids[0], client.RunCodeRequest{Code: "len(x)"})
				c.Delete(ctx, kids[0]) //nolint:errcheck
			}
			return err
		}))
		return cs.pct(0.5), rs.pct(0.5), fs.pct(0.5), err
	}

	// 50 concurrent creates on the idle server.
	var mu sync.Mutex
	var conc stats
	var ids []string
	var wg sync.WaitGroup
	t0 := time.Now()
	for i := 0; i < 50; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			t := time.Now()
			sb, err := c.Create(ctx, client.CreateRequest{})
			if err != nil {
				b.Errorf("concurrent create: %v", err)
				return
			}
			mu.Lock()
			conc, ids = append(conc, time.Since(t)), append(ids, sb.ID)
			mu.Unlock()
		}()
	}
	wg.Wait()
	wall := time.Since(t0)
	p("### 50 concurrent creates (no warm pool)\n")
	p("| p50 | p99 | wall | throughput |\n| --- | --- | --- | --- |")
	p("| %s | %s | %s | %.1f creates/s |", ms(conc.pct(0.5)), ms(conc.pct(0.99)), ms(wall), float64(len(conc))/wall.Seconds())
	for _, id := range ids {
		c.Delete(ctx, id) //nolint:errcheck
	}

	baseCreate, baseRun, baseFork, err := measure()
	if err != nil {
		b.Fatal(err)
	}
	memAvail0 := memAvailableKiB()
	p("\n### Density: idle sandboxes of the default shape on one host\n")
	p("| idle sandboxes | create p50 (x idle) | run_code p50 (x idle) | fork n=1 p50 (x idle) | host memory per sandbox | server RSS | MemAvailable |")
	p("| --- | --- | --- | --- | --- | --- | --- |")
	row := func(n int, cr, rr, fr time.Duration) {
		per := "-"
		if n > 0 {
			per = fmt.Sprintf("%.1f MiB", float64(memAvail0-memAvailableKiB())/1024/float64(n))
		}
		p("| %d | %s (%.2f) | %s (%.2f) | %s (%.2f) | %s | %d MiB | %d MiB |", n, ms(cr), ratio(cr, baseCreate), ms(rr),
			ratio(rr, baseRun), ms(fr), ratio(fr, baseFork), per, processRSSKiB(s.Pid())/1024, memAvailableKiB()/1024)
	}
	row(0, baseCreate, baseRun, baseFork)

	step := max(target/5, 1)
	var idle []string
	defer func() {
		for _, id := range idle {
			c.Delete(ctx, id) //nolint:errcheck
		}
	}()
	var stop error
	for len(idle) < target && stop == nil {
		want := min(len(idle)+step, target)
		work := make(chan struct{})
		var fill sync.WaitGroup
		for w := 0; w < 4; w++ {
			fill.Add(1)
			go func() {
				defer fill.Done()
				for range work {
					sb, err := c.Create(ctx, client.CreateRequest{})
					mu.Lock()
					if err != nil {
						stop = errors.Join(stop, err)
					} else {
						idle = append(idle, sb.ID)
					}
					mu.Unlock()
				}
			}()
		}
		for i := len(idle); i < want && stop == nil; i++ {
			work <- struct{}{}
		}
		close(work)
		fill.Wait()
		if memAvailableKiB() < 1<<20 {
			stop = errors.New("less than 1 GiB of host memory available")
		}
		cr, rr, fr, err := measure()
		if err != nil {
			stop = errors.Join(stop, err)
			continue
		}
		row(len(idle), cr, rr, fr)
	}
	if stop != nil {
		p("\nstopped at %d sandboxes: %v", len(idle), stop)
	}
	p("\n(%d idle sandboxes; host: %s)", len(idle), hostLoad())
}

func ratio(a, b time.Duration) float64 {
	if b <= 0 {
		return 0
	}
	return float64(a) / float64(b)
}

func memAvailableKiB() int {
	b, _ := os.ReadFile("/proc/meminfo")
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == "MemAvailable:" {
			n, _ := strconv.Atoi(f[1])
			return n
		}
	}
	return 0
}

func processRSSKiB(pid int) int {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == "VmRSS:" {
			n, _ := strconv.Atoi(f[1])
			return n
		}
	}
	return 0
}

func hostLoad() string {
	b, _ := os.ReadFile("/proc/loadavg")
	return "load " + strings.Join(strings.Fields(string(b))[:3], " ")
}
