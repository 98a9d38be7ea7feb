package layer

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

const (
	benchFiles    = 1000
	benchFileSize = 50 << 10 // 1,000 x 50 KiB ≈ 50 MB
)

// populateBench fills dir with benchFiles incompressible files spread over 20 directories.
func populateBench(b *testing.B, dir string) {
	rng := rand.NewChaCha8([32]byte{1})
	buf := make([]byte, benchFileSize)
	for i := 0; i < benchFiles; i++ {
		sub := filepath.Join(dir, fmt.Sprintf("d%02d", i%20))
		if err := os.MkdirAll(sub, 0o755); err != nil {
			b.Fatal(err)
		}
		_, _ = rng.Read(buf)
		if err := os.WriteFile(filepath.Join(sub, fmt.Sprintf("f%04d", i)), buf, 0o644); err != nil {
			b.Fatal(err)
		}
	}
	unix.Sync()
}

// BenchmarkClone clones a layer of 1,000 files (≈50 MB) and reports the p50 and p99 latency of Clone:
// btrfs snapshots (with full qgroups, the default; without quotas; with simple quotas), the copy driver on a
// non-reflink file system (the test's temporary directory), and the copy driver on btrfs, where files are
// reflinked.
func BenchmarkClone(b *testing.B) {
	requireRoot(b)
	ctx := context.Background()
	host, _ := openBtrfs(b)
	noQuota, _ := openBtrfsQuota(b, QuotaOff)
	simple, _ := openBtrfsQuota(b, QuotaSimple)
	drivers := []struct {
		name string
		d    Driver
	}{
		{"btrfs", host}, // full qgroups, the default
		{"btrfs-noquota", noQuota},
		{"btrfs-simplequota", simple},
		{"copy", openCopy(b, b.TempDir())},
		{"copy-reflink", openCopy(b, mustCreateB(b, host, "copyhost"))},
	}
	for _, dr := range drivers {
		src, err := dr.d.Create(ctx, "src")
		if err != nil {
			b.Fatal(err)
		}
		populateBench(b, src)
		b.Run(dr.name, func(b *testing.B) {
			var times []time.Duration
			for i := 0; i < b.N; i++ {
				start := time.Now()
				if _, err := dr.d.Clone(ctx, "src", "dst"); err != nil {
					b.Fatal(err)
				}
				times = append(times, time.Since(start))
				b.StopTimer()
				if err := dr.d.Remove(ctx, "dst"); err != nil {
					b.Fatal(err)
				}
				unix.Sync() // measure each clone from a clean state, not the previous one's writeback
				b.StartTimer()
			}
			slices.Sort(times)
			b.ReportMetric(float64(percentile(times, 50).Nanoseconds()), "p50-ns")
			b.ReportMetric(float64(percentile(times, 99).Nanoseconds()), "p99-ns")
		})
	}
}

func mustCreateB(b *testing.B, d Driver, id string) string {
	p, err := d.Create(context.Background(), id)
	if err != nil {
		b.Fatal(err)
	}
	return p
}

// percentile returns the p-th percentile (nearest rank) of sorted durations.
func percentile(sorted []time.Duration, p int) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	i := (len(sorted)*p + 99) / 100
	if i < 1 {
		i = 1
	}
	return sorted[i-1]
}

// BenchmarkCloneQuota measures what btrfs quotas cost a fork: Clone of a layer holding 200 MB (200 files of
// 1 MiB) plus setting the clone's limit, and Remove, with no quotas, full qgroups and simple quotas.
func BenchmarkCloneQuota(b *testing.B) {
	requireRoot(b)
	ctx := context.Background()
	for _, mode := range []QuotaMode{QuotaOff, QuotaFull, QuotaSimple} {
		d, _ := openBtrfsQuota(b, mode)
		src := mustCreateB(b, d, "src")
		buf := make([]byte, 1<<20)
		rng := rand.NewChaCha8([32]byte{2})
		for i := 0; i < 200; i++ {
			_, _ = rng.Read(buf)
			if err := os.WriteFile(filepath.Join(src, fmt.Sprintf("f%03d", i)), buf, 0o644); err != nil {
				b.Fatal(err)
			}
		}
		unix.Sync()
		lim, limited := LimiterOf(d)
		b.Run(string(mode), func(b *testing.B) {
			var clones, removes []time.Duration
			for i := 0; i < b.N; i++ {
				start := time.Now()
				if _, err := d.Clone(ctx, "src", "dst"); err != nil {
					b.Fatal(err)
				}
				if limited {
					if err := lim.SetLimit("dst", 1<<30); err != nil {
						b.Fatal(err)
					}
				}
				clones = append(clones, time.Since(start))
				start = time.Now()
				if err := d.Remove(ctx, "dst"); err != nil {
					b.Fatal(err)
				}
				removes = append(removes, time.Since(start))
				b.StopTimer()
				unix.Sync()
				b.StartTimer()
			}
			slices.Sort(clones)
			slices.Sort(removes)
			b.ReportMetric(float64(percentile(clones, 50).Microseconds()), "clone-p50-us")
			b.ReportMetric(float64(percentile(clones, 99).Microseconds()), "clone-p99-us")
			b.ReportMetric(float64(percentile(removes, 50).Microseconds()), "remove-p50-us")
		})
	}
}

// BenchmarkCloneParallel measures n clones of one layer made at once, as a fork of n makes them (each then given
// its limit), beside the same snapshots made side by side in the layer root (how Clone made them until it staged
// each in a directory of its own): whether btrfs batches concurrent snapshots into one transaction commit. The
// source is a sandbox's usual layer (a few small files) or 1,000 files of 50 KiB, which makes full qgroup
// accounting superlinear.
func BenchmarkCloneParallel(b *testing.B) {
	requireRoot(b)
	ctx := context.Background()
	for _, mode := range []QuotaMode{QuotaOff, QuotaFull, QuotaSimple} {
		d, _ := openBtrfsQuota(b, mode)
		bd := d.(*btrfsDriver)
		for _, kind := range []string{"small", "files"} {
			src := mustCreateB(b, d, "src-"+kind)
			if kind == "small" {
				for i := 0; i < 20; i++ {
					if err := os.WriteFile(filepath.Join(src, fmt.Sprintf("f%02d", i)), []byte("state"), 0o644); err != nil {
						b.Fatal(err)
					}
				}
				unix.Sync()
			} else {
				populateBench(b, src)
			}
			for _, n := range []int{1, 5, 32} {
				for _, how := range []string{"staged", "side-by-side"} {
					b.Run(fmt.Sprintf("%s/%s/n=%d/%s", mode, kind, n, how), func(b *testing.B) {
						clone := func(id string) error { _, err := d.Clone(ctx, "src-"+kind, id); return err }
						if how == "side-by-side" {
							clone = func(id string) error { return snapSideBySide(bd, "src-"+kind, id) }
						}
						var times []time.Duration
						for i := 0; i < b.N; i++ {
							unix.Sync()
							time.Sleep(20 * time.Millisecond) // the cleaner's turn after the last removes
							start := time.Now()
							var wg sync.WaitGroup
							errs := make([]error, n)
							for k := 0; k < n; k++ {
								wg.Add(1)
								go func(k int) {
									defer wg.Done()
									id := fmt.Sprintf("dst%d", k)
									if errs[k] = clone(id); errs[k] == nil {
										if lim, ok := LimiterOf(d); ok {
											errs[k] = lim.SetLimit(id, 1<<30)
										}
									}
								}(k)
							}
							wg.Wait()
							times = append(times, time.Since(start))
							if err := errors.Join(errs...); err != nil {
								b.Fatal(err)
							}
							b.StopTimer()
							for k := 0; k < n; k++ {
								d.Remove(ctx, fmt.Sprintf("dst%d", k)) //nolint:errcheck
							}
							b.StartTimer()
						}
						slices.Sort(times)
						b.ReportMetric(float64(percentile(times, 50).Microseconds())/1000, "p50-ms")
						b.ReportMetric(float64(percentile(times, 99).Microseconds())/1000, "p99-ms")
					})
				}
			}
		}
	}
}

// snapSideBySide snapshots layer src as dst directly in the layer root, as Clone did before it staged snapshots.
func snapSideBySide(d *btrfsDriver, src, dst string) error {
	srcFd, err := d.openLayer(src)
	if err != nil {
		return err
	}
	defer unix.Close(srcFd)
	return btrfsSnapCreate(d.rootFd, srcFd, dst)
}
