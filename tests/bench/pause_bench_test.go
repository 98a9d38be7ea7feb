package bench

import (
	"context"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/ramify-dev/ramify/client"
	"github.com/ramify-dev/ramify/internal/testserver"
)

// BenchmarkPause pauses and resumes states of 10 MB, 256 MB and 1 GiB, on the local snapshot directory and, when
// a test S3 server can be started (see startS3), on S3.
//
// The servers run as shipped, with a family started ahead (--prestart-families 1, which the test servers turn off
// by default): a resume takes it, and the server starts its next one in the background. Each state is resumed
// right after its pause (the next family may not be ready yet) and, in a second column, a second after it.
func BenchmarkPause(b *testing.B) {
	prestart := []string{"--prestart-families", "1"}
	servers := map[string]*testserver.Server{"local": testserver.Start(b, prestart...)}
	if args, ok := s3Args(b); ok {
		servers["s3"] = testserver.Start(b, append(args, prestart...)...)
	}
	out := &strings.Builder{}
	fmt.Fprintf(out, "\n### pause and resume (interpreter state of the given size, one numpy array)\n\n")
	fmt.Fprintf(out, "| store | state | pause (client: POST → paused) | resume (POST → running) | resume 1 s after the pause | pause / resume (server) | snapshot size |\n| --- | --- | --- | --- | --- | --- | --- |\n")
	for _, store := range []string{"local", "s3"} {
		s := servers[store]
		if s == nil {
			continue
		}
		c := s.Client
		ctx := context.Background()
		for _, mb := range []int{10, 256, 1024} {
			id := must(c.Create(ctx, client.CreateRequest{MemMiB: 4096})).ID
			must(c.RunCode(ctx, id, client.RunCodeRequest{Code: fmt.Sprintf("import numpy as np\nstate = np.full(%d, 7, dtype=np.uint8)\n1", mb<<20)}))
			var pauses, resumes, later, spauses, sresumes stats
			var size int64
			for r := 0; r < 6; r++ {
				t := time.Now()
				must2(c.Pause(ctx, id))
				sb := waitClose(b, c, id, "paused")
				pauses = append(pauses, time.Since(t))
				if sb.Pause != nil {
					size = sb.Pause.SnapshotBytes
					spauses = append(spauses, time.Duration(sb.Pause.PauseMs*float64(time.Millisecond)))
				}
				if r%2 == 1 {
					time.Sleep(time.Second)
				}
				t = time.Now()
				must2(c.Resume(ctx, id))
				sb = waitClose(b, c, id, "running")
				if r%2 == 1 {
					later = append(later, time.Since(t))
				} else {
					resumes = append(resumes, time.Since(t))
				}
				if sb.Pause != nil {
					sresumes = append(sresumes, time.Duration(sb.Pause.ResumeMs*float64(time.Millisecond)))
				}
			}
			ex := must(c.RunCode(ctx, id, client.RunCodeRequest{Code: "int(state.sum())"}))
			if ex.Value == nil || *ex.Value != fmt.Sprint(7*(mb<<20)) {
				b.Fatalf("state after resume: %+v", ex)
			}
			fmt.Fprintf(out, "| %s | %d MB | %s | %s | %s | %s / %s | %.1f MB |\n", store, mb, ms(pauses.pct(.5)), ms(resumes.pct(.5)),
				ms(later.pct(.5)), ms(spauses.pct(.5)), ms(sresumes.pct(.5)), float64(size)/1e6)
			c.Delete(ctx, id)
		}
	}
	fmt.Print(out.String())
	if f := os.Getenv("RAMIFY_BENCH_OUT"); f != "" {
		prev, _ := os.ReadFile(f)
		os.WriteFile(f, append(prev, []byte(out.String())...), 0o644)
	}
}

// waitClose polls every 5 ms (the client's WaitStatus backs off, which would round the times measured here up
// to its next poll).
func waitClose(b *testing.B, c *client.Client, id, want string) *client.Sandbox {
	for {
		sb := must(c.Get(context.Background(), id))
		if sb.Status == want {
			return sb
		}
		if sb.Status == client.StatusFailed {
			b.Fatalf("sandbox %s failed: %s", id, sb.Error)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func must2[T any, U any](v T, u U, err error) (T, U) {
	if err != nil {
		panic(err)
	}
	return v, u
}
