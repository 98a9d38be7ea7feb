package cgroups

import (
	"context"
	"fmt"
	"os"
	"slices"
	"testing"
	"time"
)

// TestV1KeepMovesFast: while kept warm, this process stays where it is (the warming "moves" it into its own
// cgroup), moves still work, the holds nest, and the warming stops once the last is released.
func TestV1KeepMovesFast(t *testing.T) {
	m := newTestV1(t)
	before, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		t.Fatal(err)
	}
	a, err := m.Create("warm-a", Limits{})
	if err != nil {
		t.Fatal(err)
	}
	b, err := m.Create("warm-b", Limits{})
	if err != nil {
		t.Fatal(err)
	}
	sleeper := startIn(t, []string{"sleep", "100"}, a)
	done1 := m.KeepMovesFast()
	done2 := m.KeepMovesFast()
	time.Sleep(10 * warmPeriod)
	if err := b.Add(sleeper.pid()); err != nil {
		t.Fatal(err)
	}
	if procs, err := b.Procs(); err != nil || !slices.Contains(procs, sleeper.pid()) {
		t.Fatalf("moved while warm: b holds %v (%v)", procs, err)
	}
	done1()
	done1() // a second call releases nothing more
	m.warm.mu.Lock()
	running, failed, holders := m.warm.running, m.warm.failed, m.warm.holders
	m.warm.mu.Unlock()
	if !running || failed || holders != 1 {
		t.Fatalf("with one hold left: running %v, failed %v, holders %d", running, failed, holders)
	}
	done2()
	deadline := time.Now().Add(2 * time.Second)
	for {
		m.warm.mu.Lock()
		running = m.warm.running
		m.warm.mu.Unlock()
		if !running {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("still warming after every hold was released")
		}
		time.Sleep(warmPeriod)
	}
	after, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		t.Fatal(err)
	}
	if string(after) != string(before) {
		t.Errorf("the warming moved this process:\nbefore %s\nafter %s", before, after)
	}
}

// BenchmarkV1MoveAfterPause moves a process between two cgroups (the five hierarchies ramify uses) after a
// pause of 50 ms, as forks and creates do, with and without the moves kept warm, and reports the p50 and p99
// of one move and, kept warm, how many times faster its p50 is.
//
//	go test -run '^$' -bench V1MoveAfterPause -benchtime 20x ./internal/cgroups/
func BenchmarkV1MoveAfterPause(b *testing.B) {
	m := newTestV1(b)
	x, err := m.Create("bench-x", Limits{})
	if err != nil {
		b.Fatal(err)
	}
	y, err := m.Create("bench-y", Limits{})
	if err != nil {
		b.Fatal(err)
	}
	sleeper := startIn(b, []string{"sleep", "1000"}, x)
	p50 := map[bool]time.Duration{}
	for _, warm := range []bool{false, true} {
		b.Run(fmt.Sprintf("warm=%v", warm), func(b *testing.B) {
			if warm {
				defer m.KeepMovesFast()()
			}
			var ds []time.Duration
			for i := 0; i < b.N; i++ {
				time.Sleep(50 * time.Millisecond)
				to := []Cgroup{x, y}[i%2]
				t0 := time.Now()
				if err := to.Add(sleeper.pid()); err != nil {
					b.Fatal(err)
				}
				ds = append(ds, time.Since(t0))
			}
			slices.Sort(ds)
			p50[warm] = ds[len(ds)/2]
			b.ReportMetric(float64(ds[len(ds)/2].Microseconds()), "p50-us")
			b.ReportMetric(float64(ds[len(ds)*99/100].Microseconds()), "p99-us")
			if warm && p50[false] > 0 {
				b.ReportMetric(float64(p50[false])/float64(p50[true]), "x-faster-than-cold")
			}
		})
	}
}

// TestV1KillProcessInSomeHierarchies: a process that is in the cgroup in one hierarchy only (its mover was
// killed between two writes) is killed too, and the cgroup can then be removed.
func TestV1KillProcessInSomeHierarchies(t *testing.T) {
	m := newTestV1(t)
	cg, err := m.Create("partial", Limits{})
	if err != nil {
		t.Fatal(err)
	}
	sleeper := startIn(t, []string{"sleep", "100"})
	v1 := cg.(*v1Cgroup)
	if err := addPid(v1.ctrl["memory"], sleeper.pid()); err != nil {
		t.Fatal(err)
	}
	if procs, _ := cg.Procs(); len(procs) != 0 {
		t.Fatalf("the freezer hierarchy lists %v, want nothing", procs)
	}
	if err := cg.Kill(context.Background()); err != nil {
		t.Fatalf("Kill: %v", err)
	}
	select {
	case <-sleeper.done:
	case <-time.After(5 * time.Second):
		t.Fatal("the process in the memory hierarchy only was not killed")
	}
	if err := cg.Delete(); err != nil {
		t.Fatalf("Delete after Kill: %v", err)
	}
}
