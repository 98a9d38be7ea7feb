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

// pauseStores returns the servers to measure: the local snapshot directory, and S3 when a test S3 server can be
// started (see startS3).
func BenchmarkPause(b *testing.B) {
	servers := map[string]*testserver.Server{"local": testserver.Start(b)}
	if args, ok := s3Args(b); ok {
		servers["s3"] = testserver.Start(b, args...)
	}
	out := &strings.Builder{}
	fmt.Fprintf(out, "\n### pause and resume (interpreter state of the given size, one numpy array)\n\n")
	fmt.Fprintf(out, "| store | state | pause (client: POST → paused) | resume (POST → running) | snapshot size |\n| --- | --- | --- | --- | --- |\n")
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
			var pauses, resumes stats
			var size int64
			for r := 0; r < 3; r++ {
				t := time.Now()
				must2(c.Pause(ctx, id))
				sb := must(c.WaitStatus(ctx, id, "paused"))
				pauses = append(pauses, time.Since(t))
				if sb.Pause != nil {
					size = sb.Pause.SnapshotBytes
				}
				t = time.Now()
				must2(c.Resume(ctx, id))
				must(c.WaitStatus(ctx, id, "running"))
				resumes = append(resumes, time.Since(t))
			}
			ex := must(c.RunCode(ctx, id, client.RunCodeRequest{Code: "int(state.sum())"}))
			if ex.Value == nil || *ex.Value != fmt.Sprint(7*(mb<<20)) {
				b.Fatalf("state after resume: %+v", ex)
			}
			fmt.Fprintf(out, "| %s | %d MB | %s | %s | %.1f MB |\n", store, mb, ms(pauses.pct(.5)), ms(resumes.pct(.5)), float64(size)/1e6)
			c.Delete(ctx, id)
		}
	}
	fmt.Print(out.String())
	if f := os.Getenv("RAMIFY_BENCH_OUT"); f != "" {
		prev, _ := os.ReadFile(f)
		os.WriteFile(f, append(prev, []byte(out.String())...), 0o644)
	}
}

func must2[T any, U any](v T, u U, err error) (T, U) {
	if err != nil {
		panic(err)
	}
	return v, u
}
