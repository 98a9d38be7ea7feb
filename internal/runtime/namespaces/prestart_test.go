package namespaces

import (
	"os"
	"testing"
	"time"

	"github.com/ramify-dev/ramify/internal/runtime"
)

func TestPreloadWanted(t *testing.T) {
	now := time.Now()
	ago := func(d time.Duration) time.Time { return now.Add(-d) }
	for _, c := range []struct {
		name   string
		misses []time.Time
		want   int
	}{
		{"no miss", nil, 1},
		{"one miss", []time.Time{ago(time.Second)}, 2},
		{"two misses", []time.Time{ago(time.Minute), ago(time.Second)}, 3},
		{"capped", []time.Time{ago(3 * time.Second), ago(2 * time.Second), ago(time.Second)}, maxPreloadFamilies},
		{"an old miss no longer counts", []time.Time{ago(prestartHold + time.Second), ago(time.Second)}, 2},
		{"every miss old", []time.Time{ago(2 * prestartHold), ago(prestartHold)}, 1},
	} {
		if got := preloadWanted(c.misses, now); got != c.want {
			t.Errorf("%s: preloadWanted = %d, want %d", c.name, got, c.want)
		}
	}
}

// TestPrestartPoolGrowsAfterMisses: a resume that needs numpy and finds no family with it imported ready is
// counted, and the pool then asks for one such family more (up to maxPreloadFamilies); a resume that finds one
// is not counted.
func TestPrestartPoolGrowsAfterMisses(t *testing.T) {
	start, err := procStart(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	// Families that pass usable() without being started: their "init" is this process. The pool is closed, so
	// that takePrestarted starts nothing; missingPrestarted is asked with it open.
	fam := func(preload string) prestarted {
		return prestarted{f: &family{initPid: os.Getpid(), initStart: start}, at: time.Now(), preload: preload}
	}
	r := &Runtime{cfg: Config{PrestartFamilies: 1}}
	r.pre.closed = true
	missing := func() (string, bool) {
		r.pre.mu.Lock()
		defer r.pre.mu.Unlock()
		r.pre.closed = false
		defer func() { r.pre.closed = true }()
		return r.missingPrestarted()
	}
	numpy := runtime.Spec{Preload: []string{"numpy"}, VCPU: 1}

	r.pre.idle = []prestarted{fam(""), fam("numpy")}
	if f, _ := r.takePrestarted(numpy); f == nil {
		t.Fatal("the numpy family was not taken")
	}
	if kind, need := missing(); kind != "numpy" || !need {
		t.Fatalf("after a hit: missing = %q, %v; want numpy, true", kind, need)
	}
	r.pre.idle = append(r.pre.idle, fam("numpy"))
	if kind, need := missing(); need {
		t.Fatalf("one numpy family after a hit: missing = %q, true; want none", kind)
	}

	// Two resumes close together: the second finds only the plain family (a miss), and takes it.
	r.pre.idle = []prestarted{fam(""), fam("numpy")}
	r.takePrestarted(numpy)
	if f, _ := r.takePrestarted(numpy); f == nil {
		t.Fatal("the plain family was not taken after the numpy one")
	}
	if got := len(r.pre.missedPreload["numpy"]); got != 1 {
		t.Fatalf("misses recorded: %d, want 1", got)
	}
	r.pre.idle = []prestarted{fam(""), fam("numpy")}
	if kind, need := missing(); kind != "numpy" || !need {
		t.Fatalf("one numpy family after a miss: missing = %q, %v; want numpy, true", kind, need)
	}
	r.pre.idle = append(r.pre.idle, fam("numpy"))
	if kind, need := missing(); need {
		t.Fatalf("two numpy families after a miss: missing = %q, true; want none", kind)
	}

	// More misses than the cap: the pool stops at maxPreloadFamilies.
	for range 5 {
		r.pre.idle = nil
		r.takePrestarted(numpy)
	}
	r.pre.idle = []prestarted{fam("")}
	for range maxPreloadFamilies {
		r.pre.idle = append(r.pre.idle, fam("numpy"))
	}
	if kind, need := missing(); need {
		t.Fatalf("%d numpy families after many misses: missing = %q, true; want none", maxPreloadFamilies, kind)
	}

	// A sandbox that needs no package, or one no family may preload for (two vCPUs), is no miss.
	before := len(r.pre.missedPreload["numpy"])
	r.pre.idle = nil
	r.takePrestarted(runtime.Spec{})
	r.takePrestarted(runtime.Spec{Preload: []string{"numpy"}, VCPU: 2})
	if got := len(r.pre.missedPreload["numpy"]); got != before {
		t.Fatalf("misses recorded for sandboxes no numpy family serves: %d -> %d", before, got)
	}
}
