// Package bench measures ramify end to end on a real server: sandbox create, run_code and exec round trips,
// idle memory, fork for n = 1..32 (latency, the parent's pause window, memory per child), merge, diff of
// 10,000 files, and the alternative a user has without fork. Run with `make bench`; figures go to BENCHMARKS.md.
package bench

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ramify-dev/ramify/client"
	"github.com/ramify-dev/ramify/internal/testserver"
)

type stats []time.Duration

func (s stats) pct(p float64) time.Duration {
	c := append(stats(nil), s...)
	sort.Slice(c, func(i, j int) bool { return c[i] < c[j] })
	i := int(float64(len(c)-1) * p)
	return c[i]
}

func ms(d time.Duration) string { return fmt.Sprintf("%.1f ms", float64(d.Microseconds())/1000) }

func timeIt(n int, f func()) stats {
	var s stats
	for i := 0; i < n; i++ {
		t := time.Now()
		f()
		s = append(s, time.Since(t))
	}
	return s
}

// pssKiB sums the proportional set size of the processes in a sandbox's cgroup.
func pssKiB(id string) int {
	files, _ := filepath.Glob("/sys/fs/cgroup/pids/ramify/*/" + id + "/cgroup.procs")
	more, _ := filepath.Glob("/sys/fs/cgroup/ramify/*/" + id + "/cgroup.procs")
	total := 0
	for _, f := range append(files, more...) {
		b, _ := os.ReadFile(f)
		for _, p := range strings.Fields(string(b)) {
			total += pssOfPid(p)
		}
	}
	return total
}

func pssOfPid(pid string) int { return smapsField(pid, "Pss:") }

// ussKiB sums the private (unshared) memory of the processes in a sandbox's cgroup: what the sandbox costs the
// host beyond pages it shares copy-on-write with its parent and siblings.
func ussKiB(id string) int {
	files, _ := filepath.Glob("/sys/fs/cgroup/pids/ramify/*/" + id + "/cgroup.procs")
	more, _ := filepath.Glob("/sys/fs/cgroup/ramify/*/" + id + "/cgroup.procs")
	total := 0
	for _, f := range append(files, more...) {
		b, _ := os.ReadFile(f)
		for _, p := range strings.Fields(string(b)) {
			total += smapsField(p, "Private_Clean:") + smapsField(p, "Private_Dirty:")
		}
	}
	return total
}

func smapsField(pid, name string) int {
	b, err := os.ReadFile("/proc/" + pid + "/smaps_rollup")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == name {
			n, _ := strconv.Atoi(f[1])
			return n
		}
	}
	return 0
}

// initPssKiB is the PSS of a family init (one per family of sandboxes), found as the parent of the agent.
func initPssKiB(id string) int {
	files, _ := filepath.Glob("/sys/fs/cgroup/pids/ramify/*/" + id + "/cgroup.procs")
	for _, f := range files {
		b, _ := os.ReadFile(f)
		for _, p := range strings.Fields(string(b)) {
			st, _ := os.ReadFile("/proc/" + p + "/stat")
			fs := strings.Fields(string(st[strings.LastIndexByte(string(st), ')')+1:]))
			if len(fs) > 1 {
				if cmd, _ := os.ReadFile("/proc/" + fs[1] + "/cmdline"); strings.Contains(string(cmd), "__init") {
					return pssOfPid(fs[1])
				}
			}
		}
	}
	return 0
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}

func BenchmarkRamify(b *testing.B) {
	// The fork table's n=32 row holds 33 sandboxes of 2 GiB limits, and its alternative 32 more: past the default
	// admission of 4x the host's memory, though copy-on-write keeps what they use small.
	// --fork-ahead 0: the fork table times forks that make their children (BenchmarkForkAhead times the others).
	s := testserver.Start(b, "--mem-overcommit", "16", "--fork-ahead", "0")
	c := s.Client
	ctx := context.Background()
	out := &strings.Builder{}
	p := func(format string, a ...any) { fmt.Fprintf(out, format+"\n", a...) }
	p("\n## ramify benchmark (%s)\n", time.Now().UTC().Format(time.RFC3339))

	// Core: create, run_code, exec, idle memory.
	var ids []string
	// With the warm pool (default 2): creates spaced so that the pool refills in between, as in an agent loop.
	createS := timeIt(20, func() {
		time.Sleep(400 * time.Millisecond)
		t := time.Now()
		ids = append(ids, must(c.Create(ctx, client.CreateRequest{})).ID)
		warmCreate = append(warmCreate, time.Since(t))
	})
	_ = createS
	createS = warmCreate
	cold := testserver.Start(b, "--warm-pool", "0")
	var coldIDs []string
	coldS := timeIt(20, func() { coldIDs = append(coldIDs, must(cold.Client.Create(ctx, client.CreateRequest{})).ID) })
	for _, x := range coldIDs {
		cold.Client.Delete(ctx, x)
	}
	cold.Stop()
	// Cold, as shipped: a family started ahead (with its zygote) takes the create; creates spaced as the warm ones,
	// so that the server has started the next family in between.
	pre := testserver.Start(b, "--warm-pool", "0", "--prestart-families", "1")
	var preIDs []string
	var preS stats
	for i := 0; i < 20; i++ {
		time.Sleep(400 * time.Millisecond)
		t := time.Now()
		preIDs = append(preIDs, must(pre.Client.Create(ctx, client.CreateRequest{})).ID)
		preS = append(preS, time.Since(t))
	}
	for _, x := range preIDs {
		pre.Client.Delete(ctx, x)
	}
	pre.Stop()
	id := ids[0]
	must(c.RunCode(ctx, id, client.RunCodeRequest{Code: "1+1"}))
	runS := timeIt(300, func() { must(c.RunCode(ctx, id, client.RunCodeRequest{Code: "1+1"})) })
	execS := timeIt(100, func() { must(c.Exec(ctx, id, client.ExecRequest{Argv: []string{"true"}})) })
	time.Sleep(500 * time.Millisecond)
	pss, initPss := 0, 0
	for _, x := range ids {
		pss += pssKiB(x)
		initPss += initPssKiB(x)
	}
	p("| measure | p50 | p99 | n |\n| --- | --- | --- | --- |")
	p("| sandbox create, warm pool (POST /v1/sandboxes → running) | %s | %s | %d |", ms(createS.pct(.5)), ms(createS.pct(.99)), len(createS))
	p("| sandbox create, cold (--warm-pool 0 --prestart-families 0, back to back) | %s | %s | %d |", ms(coldS.pct(.5)), ms(coldS.pct(.99)), len(coldS))
	p("| sandbox create, cold with a family started ahead (--warm-pool 0, the default --prestart-families 1) | %s | %s | %d |", ms(preS.pct(.5)), ms(preS.pct(.99)), len(preS))
	p("| run_code `1+1` round trip | %s | %s | %d |", ms(runS.pct(.5)), ms(runS.pct(.99)), len(runS))
	p("| exec `true` round trip | %s | %s | %d |", ms(execS.pct(.5)), ms(execS.pct(.99)), len(execS))
	p("\nidle sandbox host memory (PSS of agent + interpreter, plus its family init): %.1f MiB + %.1f MiB = %.1f MiB (mean of %d)",
		float64(pss)/1024/float64(len(ids)), float64(initPss)/1024/float64(len(ids)), float64(pss+initPss)/1024/float64(len(ids)), len(ids))
	for _, x := range ids {
		c.Delete(ctx, x)
	}

	// Fork: a parent that loaded a 200 MB array.
	const setup = "import numpy as np\ndata = np.ones(25_000_000)\nint(data.nbytes)"
	parent := must(c.Create(ctx, client.CreateRequest{MemMiB: 8192})).ID
	must(c.RunCode(ctx, parent, client.RunCodeRequest{Code: setup}))
	p("\n### fork of a parent holding a 200 MB numpy array\n")
	p("| n | total p50 | total p99 | parent pause p50 | private memory per child (USS) | PSS per child | fresh sandboxes + same setup (p50) | fork speed-up | floor: bare os.fork x n (p50) |")
	p("| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
	for _, n := range []int{1, 2, 5, 16, 32} {
		reps := 5
		if n >= 16 {
			reps = 3
		}
		var tot stats
		var pauses []float64
		var childPss, childUss []int
		for r := 0; r < reps; r++ {
			t := time.Now()
			res, err := forkRaw(ctx, s, parent, n)
			if err != nil {
				b.Fatal(err)
			}
			tot = append(tot, time.Since(t))
			pauses = append(pauses, res.pause)
			if r == 0 {
				time.Sleep(200 * time.Millisecond)
				for _, k := range res.children {
					childPss = append(childPss, pssKiB(k))
					childUss = append(childUss, ussKiB(k))
				}
			}
			var wg sync.WaitGroup
			for _, k := range res.children {
				wg.Add(1)
				go func(k string) { defer wg.Done(); c.Delete(ctx, k) }(k)
			}
			wg.Wait()
		}
		sort.Float64s(pauses)
		meanPss := 0
		for _, v := range childPss {
			meanPss += v
		}
		meanPss /= max(len(childPss), 1)
		meanUss := 0
		for _, v := range childUss {
			meanUss += v
		}
		meanUss /= max(len(childUss), 1)
		// The alternative: n fresh sandboxes, each re-running the setup (in parallel, as a user would).
		var alt stats
		altReps := 2
		if n >= 16 {
			altReps = 1
		}
		for r := 0; r < altReps; r++ {
			t := time.Now()
			var wg sync.WaitGroup
			fresh := make([]string, n)
			for i := 0; i < n; i++ {
				wg.Add(1)
				go func(i int) {
					defer wg.Done()
					fresh[i] = must(c.Create(ctx, client.CreateRequest{MemMiB: 1024})).ID
					must(c.RunCode(ctx, fresh[i], client.RunCodeRequest{Code: setup}))
				}(i)
			}
			wg.Wait()
			alt = append(alt, time.Since(t))
			for _, f := range fresh {
				c.Delete(ctx, f)
			}
		}
		p("| %d | %s | %s | %.1f ms | %.1f MiB | %.1f MiB | %s | %.1fx | %.1f ms |", n, ms(tot.pct(.5)), ms(tot.pct(.99)), pauses[len(pauses)/2],
			float64(meanUss)/1024, float64(meanPss)/1024, ms(alt.pct(.5)), float64(alt.pct(.5))/float64(tot.pct(.5)), bareFork(ctx, b, c, parent, n))
	}

	// Merge.
	mergeS := timeIt(10, func() {
		kids := must(c.Fork(ctx, parent, 1))
		t := time.Now()
		if err := c.MergeInto(ctx, parent, kids[0]); err != nil {
			b.Fatal(err)
		}
		mergeS0 = append(mergeS0, time.Since(t))
	})
	_ = mergeS
	p("\n| measure | p50 | p99 | n |\n| --- | --- | --- | --- |")
	p("| merge_into (winner of a fork(1)) | %s | %s | %d |", ms(mergeS0.pct(.5)), ms(mergeS0.pct(.99)), len(mergeS0))

	// Diff of 10,000 files written before a fork, unchanged in both children.
	must(c.RunCode(ctx, parent, client.RunCodeRequest{Code: "import os\nfor i in range(10000):\n    d = '/root/files/%03d' % (i % 100)\n    os.makedirs(d, exist_ok=True)\n    open(d + '/f%d' % i, 'w').write('x' * (i % 300))\n1"}))
	kids := must(c.Fork(ctx, parent, 2))
	diffS := timeIt(20, func() {
		d := must(c.Diff(ctx, kids[0], kids[1], nil))
		if len(d.Added)+len(d.Removed)+len(d.Modified) != 0 {
			b.Fatalf("unexpected diff %+v", d)
		}
	})
	p("| diff of 10,000 unchanged files (two fork children) | %s | %s | %d |", ms(diffS.pct(.5)), ms(diffS.pct(.99)), len(diffS))
	must(c.RunCode(ctx, kids[1], client.RunCodeRequest{Code: "for i in range(0, 10000, 10):\n    d = '/root/files/%03d' % (i % 100)\n    open(d + '/f%d' % i, 'w').write('y' * (i % 300))\n1"}))
	diff2 := timeIt(10, func() { must(c.Diff(ctx, kids[0], kids[1], nil)) })
	p("| diff of 10,000 files, 1,000 rewritten in one child | %s | %s | %d |", ms(diff2.pct(.5)), ms(diff2.pct(.99)), len(diff2))

	fmt.Print(out.String())
	if f := os.Getenv("RAMIFY_BENCH_OUT"); f != "" {
		os.WriteFile(f, []byte(out.String()), 0o644)
	}
}

var mergeS0, warmCreate stats

type forkOut struct {
	children []string
	pause    float64
	ahead    bool // the children were made ahead (internal/sandbox/ahead.go)
}

// forkRaw calls the fork route directly to read the parent's pause window from the response.
func forkRaw(ctx context.Context, s *testserver.Server, id string, n int) (forkOut, error) {
	var res struct {
		Children      []string `json:"children"`
		ParentPauseMs float64  `json:"parent_pause_ms"`
		MadeAhead     bool     `json:"made_ahead"`
	}
	if err := s.PostJSON(ctx, "/v1/sandboxes/"+id+"/fork", map[string]int{"n": n}, &res); err != nil {
		return forkOut{}, err
	}
	return forkOut{res.Children, res.ParentPauseMs, res.MadeAhead}, nil
}

// bareFork measures, inside the parent's interpreter, n plain os.fork() calls whose children only report back and
// exit: the least any fork that copies the interpreter process can cost on this machine (median of 3, ms).
func bareFork(ctx context.Context, b *testing.B, c *client.Client, parent string, n int) float64 {
	code := fmt.Sprintf(`import os, time
def _bare(n):
    r, w = os.pipe()
    t = time.perf_counter()
    pids = []
    for _ in range(n):
        pid = os.fork()
        if pid == 0:
            os.write(w, b"x")
            os._exit(0)
        pids.append(pid)
    for _ in range(n):
        os.read(r, 1)
    took = time.perf_counter() - t
    for pid in pids:
        os.waitpid(pid, 0)
    os.close(r); os.close(w)
    return took
sorted(_bare(%d) for _ in range(3))[1] * 1000`, n)
	ex := must(c.RunCode(ctx, parent, client.RunCodeRequest{Code: code}))
	if ex.Value == nil {
		b.Fatalf("bare fork: %+v", ex)
	}
	v, err := strconv.ParseFloat(*ex.Value, 64)
	if err != nil {
		b.Fatalf("bare fork: %v", err)
	}
	return v
}
