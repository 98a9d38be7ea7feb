package bench

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ramify-dev/ramify/client"
	"github.com/ramify-dev/ramify/internal/testserver"
)

// forkStates are the parent states BenchmarkForkFloor forks: a numpy array (which numpy backs with transparent
// huge pages where the kernel allows them), the same size in ordinary Python objects (pymalloc arenas and
// malloc: what most agents' state looks like), and 200 MB of files written to the sandbox's disk (pip installs,
// a dataset) with a small interpreter: what the layer snapshots cost, which depends on --layer-quota (pass
// RAMIFY_BENCH_EXTRA_ARGS="--layer-quota simple" to compare).
var forkStates = []struct{ tag, name, setup string }{
	{"numpy", "200 MB numpy array", "import numpy as np\ndata = np.ones(25_000_000)\nint(data.nbytes)"},
	{"objects", "~200 MB of Python objects (dicts, lists, strings)",
		"data = [{'k': i, 's': 'v%08d' % i, 'l': [i, i + 1]} for i in range(600_000)]\nlen(data)"},
	{"files", "200 MB of files on its disk (200 files of 1 MiB), a small interpreter",
		"import os\nos.makedirs('/root/data', exist_ok=True)\nfor i in range(200):\n    with open('/root/data/f%03d' % i, 'wb') as f:\n        f.write(os.urandom(1 << 20))\nos.sync()\nlen(os.listdir('/root/data'))"},
}

// BenchmarkForkFloor times fork(n) until every child has answered its first run_code, beside its floor measured
// in the same run (n bare os.fork() of the same interpreter, inside the parent's sandbox), for each kind of
// parent state, and summarizes the server's fork phases (debug logs); then the same interpreter and state forked on
// the host without ramify, bare and isolated, with what a page fault costs here (hostFloor; RAMIFY_BENCH_HOST_FLOOR=0
// leaves it out). n and the repetitions come from
// RAMIFY_BENCH_FORK_N (default "1,5,32") and RAMIFY_BENCH_FORK_REPS (default 5). Run with
// `make bench BENCH=ForkFloor`.
func BenchmarkForkFloor(b *testing.B) {
	ns, reps := forkShape([]int{1, 5, 32}, 5)
	// --fork-ahead 0: every fork makes its children (BenchmarkForkAhead times forks that take children made ahead).
	s := testserver.Start(b, append([]string{"--log-level", "debug", "--fork-ahead", "0"}, strings.Fields(os.Getenv("RAMIFY_BENCH_EXTRA_ARGS"))...)...)
	c := s.Client
	ctx := context.Background()
	out := &strings.Builder{}
	p := func(format string, a ...any) { fmt.Fprintf(out, format+"\n", a...) }
	var forkNs []key                     // every fork of the run, in order
	var rows []row                       // where each table row begins in out
	p50s := map[string]map[int]float64{} // ramify's p50 in ms, by state tag and n
	load, _ := os.ReadFile("/proc/loadavg")
	p("\n## fork beside its floor (%s, load %s)\n", time.Now().UTC().Format(time.RFC3339), strings.Join(strings.Fields(string(load))[:3], " "))
	for _, st := range forkStates {
		// 2 GiB each: 33 sandboxes of that stay within the server's default memory overcommit.
		parent := must(c.Create(ctx, client.CreateRequest{MemMiB: 2048})).ID
		must(c.RunCode(ctx, parent, client.RunCodeRequest{Code: st.setup}))
		rss, huge := interpreterMemKiB(parent)
		p("### parent: %s (interpreter RSS %.0f MiB, AnonHugePages %.0f MiB)\n", st.name, float64(rss)/1024, float64(huge)/1024)
		p("| n | fork until every child answers, p50 | p99 | first fork of the family | floor: n bare os.fork (p50 of 3) | p50 / floor | CPU in the parent's cgroup, p50 | server CPU, p50 | USS per child (mean) | server phases, p50 (ms since the fork began) |")
		p("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
		first := true
		p50s[st.tag] = map[int]float64{}
		for _, n := range ns {
			var tot, pcpu, scpu stats
			ussSum, ussN = 0, 0
			firstS := "-"
			for r := 0; r < reps+1; r++ {
				d, pc, sc := forkReady(ctx, b, s, c, parent, n)
				forkNs = append(forkNs, key{st.name, n, r == 0})
				if r == 0 {
					// The family's first fork finds the spares started for it as its run_code began
					// (--spare-agents-ahead), if they are up by then, and starts the others; later forks
					// find the spares their previous fork left.
					if first {
						firstS = ms(d)
					}
					first = false
					continue
				}
				tot, pcpu, scpu = append(tot, d), append(pcpu, pc), append(scpu, sc)
			}
			floor := bareFork(ctx, b, c, parent, n)
			p50 := float64(tot.pct(.5).Microseconds()) / 1000
			p50s[st.tag][n] = p50
			rows = append(rows, row{key{st.name, n, false}, len(out.String())})
			p("| %d | %s | %s | %s | %.1f ms | %.1fx | %s | %s | %.1f MiB |", n, ms(tot.pct(.5)), ms(tot.pct(.99)), firstS, floor,
				p50/floor, ms(pcpu.pct(.5)), ms(scpu.pct(.5)), float64(ussSum)/1024/float64(max(ussN, 1)))
		}
		c.Delete(ctx, parent)
		p("")
	}
	// Each row's last column: the server's fork phases of that row's forks (they ran one at a time, in order).
	phases := forkPhases(s.Log(), forkNs)
	text := out.String()
	for i := len(rows) - 1; i >= 0; i-- {
		at := rows[i].at + strings.IndexByte(text[rows[i].at:], '\n')
		text = text[:at] + " " + phases[rows[i].key] + " |" + text[at:]
	}
	// The same interpreter and state forked on the host in the same run, without ramify: bare, and with what an
	// isolated child needs at least (scripts/fork-floor), beside what a page fault costs here, which bounds both.
	if os.Getenv("RAMIFY_BENCH_HOST_FLOOR") != "0" {
		text += hostFloor(b, ns, reps, p50s)
	}
	fmt.Print(text)
	out.Reset()
	out.WriteString(text)
	if f := os.Getenv("RAMIFY_BENCH_OUT"); f != "" {
		os.WriteFile(f, []byte(out.String()), 0o644)
	}
}

// hostFloor runs scripts/fork-floor for the numpy and the objects parent and each fork size of ns, and returns
// its tables (the header lines and rows it prints), set off as the host's floor, then each of ramify's p50s
// (p50s, by state tag and n) beside the host's isolated and bare p50 for the same state and n, with the ratios.
func hostFloor(b *testing.B, ns []int, reps int, p50s map[string]map[int]float64) string {
	var sizes []string
	for _, n := range ns {
		if n > 1 {
			sizes = append(sizes, strconv.Itoa(n))
		}
	}
	out := &strings.Builder{}
	fmt.Fprintf(out, "\n### floor on the host, same run: the same interpreter and state forked without ramify (scripts/fork-floor)\n\n")
	summary := &strings.Builder{}
	fmt.Fprintf(summary, "### ramify beside the host's floor (p50 until every child answers)\n\n")
	fmt.Fprintf(summary, "| parent | n | ramify | host, isolated | host, bare forks | ramify / isolated | ramify / bare |\n| --- | --- | --- | --- | --- | --- | --- |\n")
	for _, state := range []string{"numpy", "objects"} {
		args := []string{"-reps", strconv.Itoa(reps), "-state", state}
		if len(sizes) > 0 {
			args = append(args, "-n", strings.Join(sizes, ","))
		}
		got, err := exec.Command("../../scripts/fork-floor", args...).Output()
		if err != nil {
			b.Fatalf("scripts/fork-floor %s: %v\n%s", strings.Join(args, " "), err, got)
		}
		for _, line := range strings.Split(string(got), "\n") {
			if strings.HasPrefix(line, "fork floor") || strings.HasPrefix(line, "page faults") || strings.HasPrefix(line, "|") {
				out.WriteString(line + "\n")
			}
			// A row: | n | isolated p50 | p99 | steps | bare p50 | ratio |
			f := strings.Split(line, "|")
			if len(f) != 8 {
				continue
			}
			n, err := strconv.Atoi(strings.TrimSpace(f[1]))
			iso, bare := msField(f[2]), msField(f[5])
			if r, ok := p50s[state][n]; err == nil && ok && iso > 0 && bare > 0 {
				fmt.Fprintf(summary, "| %s | %d | %.1f ms | %.1f ms | %.1f ms | %.1fx | %.1fx |\n", state, n, r, iso, bare, r/iso, r/bare)
			}
		}
		out.WriteString("\n")
	}
	return out.String() + summary.String() + "\n"
}

// msField is a table cell such as " 92.2 ms " in milliseconds (0 if it is not one).
func msField(cell string) float64 {
	v, err := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(cell), " ms"), 64)
	if err != nil {
		return 0
	}
	return v
}

// ussSum and ussN add up the private memory (USS) of every fork child, measured once it has answered.
var ussSum, ussN int

type key struct {
	state string
	n     int
	first bool
}

type row struct {
	key key
	at  int
}

// forkReady forks parent into n children and returns the time until every child has answered a run_code, with
// the CPU time charged meanwhile to the parent's cgroup (its interpreter's forking, and the forked interpreters
// until they are moved out) and used by the server process; the children are deleted afterwards, and the
// family's spare agents given time to be started again.
func forkReady(ctx context.Context, b *testing.B, s *testserver.Server, c *client.Client, parent string, n int) (wall, parentCPU, serverCPU time.Duration) {
	pc0, sc0 := cgroupCPU(parent), processCPU(s.Pid())
	t := time.Now()
	res, err := forkRaw(ctx, s, parent, n)
	if err != nil {
		b.Fatal(err)
	}
	var wg sync.WaitGroup
	for _, k := range res.children {
		wg.Add(1)
		go func(k string) { defer wg.Done(); must(c.RunCode(ctx, k, client.RunCodeRequest{Code: "1"})) }(k)
	}
	wg.Wait()
	wall, parentCPU, serverCPU = time.Since(t), cgroupCPU(parent)-pc0, processCPU(s.Pid())-sc0
	for _, k := range res.children {
		ussSum, ussN = ussSum+ussKiB(k), ussN+1
	}
	for _, k := range res.children {
		wg.Add(1)
		go func(k string) { defer wg.Done(); c.Delete(ctx, k) }(k)
	}
	wg.Wait()
	time.Sleep(time.Duration(300+20*n) * time.Millisecond) // spares refill in the background after a fork
	return wall, parentCPU, serverCPU
}

// cgroupCPU is the CPU time used so far by sandbox id's cgroup (cgroup v1 cpuacct).
func cgroupCPU(id string) time.Duration {
	files, _ := filepath.Glob("/sys/fs/cgroup/cpuacct/ramify/*/" + id + "/cpuacct.usage")
	if len(files) == 0 {
		return 0
	}
	b, _ := os.ReadFile(files[0])
	v, _ := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	return time.Duration(v)
}

// processCPU is the user and system CPU time used so far by process pid (all its threads).
func processCPU(pid int) time.Duration {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+2:]))
	utime, _ := strconv.ParseInt(f[11], 10, 64)
	stime, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(utime+stime) * (time.Second / 100) // USER_HZ
}

// interpreterMemKiB is the RSS and AnonHugePages of the python3 process in sandbox id's cgroup.
func interpreterMemKiB(id string) (rss, huge int) {
	for _, pid := range testserver.SandboxPids(id) {
		p := strconv.Itoa(pid)
		if cmd, _ := os.ReadFile("/proc/" + p + "/cmdline"); strings.HasPrefix(string(cmd), "python3") {
			return smapsField(p, "Rss:"), smapsField(p, "AnonHugePages:")
		}
	}
	return 0, 0
}

var phaseLine = regexp.MustCompile(`msg="fork phase" phase="?([^"=]+?)"? ms=([0-9.]+)`)

// forkPhases summarizes the server's "fork phase" debug lines per kind of fork (forks is every fork of the run,
// in order; each began with a "layers cloned" phase, "snapshot" before the children's layers were cloned from the
// parent directly): each phase's median time since its fork began.
func forkPhases(log string, forks []key) map[key]string {
	byKey := map[key]map[string][]float64{}
	var order []string
	seen := map[string]bool{}
	f := -1
	for _, m := range phaseLine.FindAllStringSubmatch(log, -1) {
		if m[1] == "layers cloned" || m[1] == "snapshot" {
			f++
		}
		if f < 0 || f >= len(forks) {
			continue
		}
		v, _ := strconv.ParseFloat(m[2], 64)
		if !seen[m[1]] {
			seen[m[1]] = true
			order = append(order, m[1])
		}
		if byKey[forks[f]] == nil {
			byKey[forks[f]] = map[string][]float64{}
		}
		byKey[forks[f]][m[1]] = append(byKey[forks[f]][m[1]], v)
	}
	out := map[key]string{}
	for k, phases := range byKey {
		var parts []string
		for _, ph := range order {
			if v := phases[ph]; len(v) > 0 {
				sort.Float64s(v)
				parts = append(parts, fmt.Sprintf("%s %.1f", ph, v[len(v)/2]))
			}
		}
		out[k] = strings.Join(parts, ", ")
	}
	return out
}

// BenchmarkForkAhead times, in one server and run, fork(n) of an idle parent that forked before (its children made
// ahead: internal/sandbox/ahead.go) against fork(n) of the same parent right after a run_code on it (which drops
// them: the fork makes its own), alternately, each until every child has answered its first run_code, beside n
// bare os.fork() of the same interpreter. n and the repetitions come from RAMIFY_BENCH_FORK_N (default "1,5,8")
// and RAMIFY_BENCH_FORK_REPS (default 8). Run with `make bench BENCH=ForkAhead`.
func BenchmarkForkAhead(b *testing.B) {
	ns, reps := forkShape([]int{1, 5, 8}, 8)
	s := testserver.Start(b, strings.Fields(os.Getenv("RAMIFY_BENCH_EXTRA_ARGS"))...)
	c := s.Client
	ctx := context.Background()
	out := &strings.Builder{}
	p := func(format string, a ...any) { fmt.Fprintf(out, format+"\n", a...) }
	load, _ := os.ReadFile("/proc/loadavg")
	p("\n## fork with children made ahead (%s, load %s)\n", time.Now().UTC().Format(time.RFC3339), strings.Join(strings.Fields(string(load))[:3], " "))
	for _, st := range forkStates[:2] {
		parent := must(c.Create(ctx, client.CreateRequest{MemMiB: 2048})).ID
		must(c.RunCode(ctx, parent, client.RunCodeRequest{Code: st.setup}))
		p("### parent: %s\n", st.name)
		p("| n | idle parent: until every child answers, p50 | p99 | the call alone, p50 | then a second run_code each, p50 | right after a run_code: p50 | p99 | ratio | floor: n bare os.fork | idle / floor | forks served ahead |")
		p("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
		for _, n := range ns {
			forkAnswered(ctx, b, s, c, parent, n) // the parent's first fork of n: the shape of its children made ahead
			var idle, call, second, busy stats
			served := 0
			for r := 0; r < reps; r++ {
				time.Sleep(1500 * time.Millisecond) // idle: its children are made ahead meanwhile
				d, dc, d2, ahead := forkAnswered(ctx, b, s, c, parent, n)
				idle, call, second = append(idle, d), append(call, dc), append(second, d2)
				if ahead {
					served++
				}
				must(c.RunCode(ctx, parent, client.RunCodeRequest{Code: "1"}))
				d, _, _, _ = forkAnswered(ctx, b, s, c, parent, n)
				busy = append(busy, d)
			}
			floor := bareFork(ctx, b, c, parent, n)
			p("| %d | %s | %s | %s | %s | %s | %s | %.1fx | %.1f ms | %.1fx | %d of %d |", n, ms(idle.pct(.5)), ms(idle.pct(.99)), ms(call.pct(.5)),
				ms(second.pct(.5)), ms(busy.pct(.5)), ms(busy.pct(.99)), float64(busy.pct(.5))/float64(idle.pct(.5)), floor,
				float64(idle.pct(.5).Microseconds())/1000/floor, served, reps)
		}
		c.Delete(ctx, parent)
		p("")
	}
	fmt.Print(out.String())
	if f := os.Getenv("RAMIFY_BENCH_OUT"); f != "" {
		os.WriteFile(f, []byte(out.String()), 0o644)
	}
}

// forkAnswered forks parent into n children and returns the time until every child has answered a run_code, the
// time the fork call alone took, the time a second run_code on every child took (their first runs' extra cost
// is wall - call - second) and whether its children were made ahead; the children are deleted afterwards.
func forkAnswered(ctx context.Context, b *testing.B, s *testserver.Server, c *client.Client, parent string, n int) (wall, call, second time.Duration, ahead bool) {
	t := time.Now()
	res, err := forkRaw(ctx, s, parent, n)
	if err != nil {
		b.Fatal(err)
	}
	call = time.Since(t)
	var wg sync.WaitGroup
	runAll := func() {
		for _, k := range res.children {
			wg.Add(1)
			go func(k string) { defer wg.Done(); must(c.RunCode(ctx, k, client.RunCodeRequest{Code: "1"})) }(k)
		}
		wg.Wait()
	}
	runAll()
	wall = time.Since(t)
	t2 := time.Now()
	runAll()
	second = time.Since(t2)
	for _, k := range res.children {
		wg.Add(1)
		go func(k string) { defer wg.Done(); c.Delete(ctx, k) }(k)
	}
	wg.Wait()
	return wall, call, second, res.ahead
}

// forkShape is the fork sizes and repetitions a fork benchmark runs: RAMIFY_BENCH_FORK_N (comma-separated) and
// RAMIFY_BENCH_FORK_REPS, else ns and reps.
func forkShape(ns []int, reps int) ([]int, int) {
	if v := os.Getenv("RAMIFY_BENCH_FORK_N"); v != "" {
		ns = nil
		for _, f := range strings.Split(v, ",") {
			ns = append(ns, must(strconv.Atoi(strings.TrimSpace(f))))
		}
	}
	if v := os.Getenv("RAMIFY_BENCH_FORK_REPS"); v != "" {
		reps = must(strconv.Atoi(v))
	}
	return ns, reps
}
