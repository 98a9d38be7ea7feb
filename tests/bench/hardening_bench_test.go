package bench

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/ramify-dev/ramify/client"
	"github.com/ramify-dev/ramify/internal/testserver"
)

// BenchmarkHardeningCost measures what the hardening costs: create, run_code, exec and fork on this build against
// a baseline build of ramify (RAMIFY_BENCH_BASELINE_BINARY, e.g. built from the commit before the hardening), in
// alternating rounds on the same machine so that load and drift fall on both alike. It prints p50/p99 of each
// and the ratio of the p50s.
//
//	RAMIFY_BENCH_BASELINE_BINARY=/tmp/ramify-base [RAMIFY_BENCH_ROUNDS=3] make bench BENCH=HardeningCost
func BenchmarkHardeningCost(b *testing.B) {
	base := os.Getenv("RAMIFY_BENCH_BASELINE_BINARY")
	if base == "" {
		b.Skip("RAMIFY_BENCH_BASELINE_BINARY is not set: build the baseline (e.g. git worktree add /tmp/base <commit> && cd /tmp/base && make build) and point it at bin/ramify")
	}
	builds := []struct{ name, bin string }{{"baseline", base}, {"this build", testserver.Binary(b)}}
	type series map[string]stats
	results := map[string]series{}
	order := []string{"create (no warm pool)", "run_code 1+1", "exec true", "fork n=1 (200 MB parent)", "fork n=5 (200 MB parent)"}
	rounds := 3
	if v, err := strconv.Atoi(os.Getenv("RAMIFY_BENCH_ROUNDS")); err == nil && v > 0 {
		rounds = v // more rounds: tighter medians on a noisy machine
	}
	for round := 0; round < rounds; round++ {
		for _, bd := range builds {
			r := results[bd.name]
			if r == nil {
				r = series{}
				results[bd.name] = r
			}
			args := []string{"--warm-pool", "0"}
			if extra := os.Getenv("RAMIFY_BENCH_EXTRA_ARGS"); extra != "" && bd.name == "this build" {
				args = append(args, strings.Fields(extra)...) // e.g. "--layer-quota off": what one feature costs
			}
			s := testserver.StartBinary(b, bd.bin, args...)
			c := s.Client
			ctx := testserver.Ctx(b)
			r[order[0]] = append(r[order[0]], timeIt(6, func() {
				sb := must(c.Create(ctx, client.CreateRequest{}))
				defer c.Delete(ctx, sb.ID)
			})...)
			id := must(c.Create(ctx, client.CreateRequest{MemMiB: 2048})).ID
			must(c.RunCode(ctx, id, client.RunCodeRequest{Code: "import numpy as np; a = np.ones(200 << 17)"})) // 200 MB
			r[order[1]] = append(r[order[1]], timeIt(100, func() { must(c.RunCode(ctx, id, client.RunCodeRequest{Code: "1+1"})) })...)
			r[order[2]] = append(r[order[2]], timeIt(30, func() { must(c.Exec(ctx, id, client.ExecRequest{Argv: []string{"true"}})) })...)
			for _, n := range []int{1, 5} {
				key := order[3]
				if n == 5 {
					key = order[4]
				}
				for _, k := range must(c.Fork(ctx, id, n)) { // the family's first fork starts its spare agents
					c.Delete(ctx, k)
				}
				for i := 0; i < 4; i++ {
					time.Sleep(200 * time.Millisecond) // spares refilled, clean-up done
					start := time.Now()
					kids := must(c.Fork(ctx, id, n))
					for _, k := range kids { // until every child is ready: its first run_code answers
						must(c.RunCode(ctx, k, client.RunCodeRequest{Code: "a[0]"}))
					}
					r[key] = append(r[key], time.Since(start))
					for _, k := range kids {
						c.Delete(ctx, k)
					}
				}
			}
			c.Delete(ctx, id)
		}
	}
	p := func(format string, a ...any) { fmt.Printf(format+"\n", a...) }
	p("\n| measure | baseline p50 | baseline p99 | this build p50 | this build p99 | ratio (p50) | n |\n| --- | --- | --- | --- | --- | --- | --- |")
	for _, m := range order {
		o, n := results["baseline"][m], results["this build"][m]
		p("| %s | %s | %s | %s | %s | %.2f | %d |", m, ms(o.pct(.5)), ms(o.pct(.99)), ms(n.pct(.5)), ms(n.pct(.99)),
			float64(n.pct(.5))/float64(o.pct(.5)), len(n))
	}
}
