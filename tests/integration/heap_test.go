package integration

import (
	"os"
	"strconv"
	"strings"
	"testing"

	"github.com/ramify-dev/ramify/client"
	"github.com/ramify-dev/ramify/internal/testserver"
)

// The interpreter's heap of ordinary Python objects gets transparent huge pages (cheap forks of it), and the
// allocator settings that do so stay out of the sandbox's environment: the sandbox's own values are what user
// code and its processes see.
func TestInterpreterHeapHugePages(t *testing.T) {
	s := testserver.Start(t)
	own := create(t, s, &client.CreateRequest{Env: map[string]string{"PYTHONMALLOC": "pymalloc"}})
	if v := value(t, s, own, "import os\nos.environ.get('PYTHONMALLOC')"); v != "'pymalloc'" {
		t.Fatalf("the sandbox's PYTHONMALLOC: %s, want 'pymalloc'", v)
	}
	// The same after the interpreter restarts (it starts with the sandbox's env this time).
	run(t, s, own, "import os\nos._exit(0)")
	if v := value(t, s, own, "import os, subprocess\n(os.environ.get('PYTHONMALLOC'), subprocess.run(['sh', '-c', 'echo $PYTHONMALLOC'], capture_output=True, text=True).stdout)"); v != "('pymalloc', 'pymalloc\\n')" {
		t.Fatalf("the sandbox's PYTHONMALLOC after a restart: %s", v)
	}
	id := create(t, s, &client.CreateRequest{MemMiB: 1024})
	want := "(None, None, None)"
	if v := value(t, s, id, "import os\n(os.environ.get('GLIBC_TUNABLES'), os.environ.get('PYTHONMALLOC'), os.environ.get('RAMIFY_HEAP_ENV'))"); v != want {
		t.Fatalf("interpreter environment: %s, want %s", v, want)
	}
	if out := sh(t, s, id, "env").Stdout; strings.Contains(out, "PYTHONMALLOC") || strings.Contains(out, "RAMIFY_HEAP_ENV") {
		t.Fatalf("exec environment has the interpreter's allocator settings:\n%s", out)
	}
	if v := value(t, s, id, "import subprocess\nsubprocess.run(['env'], capture_output=True, text=True).stdout.count('PYTHONMALLOC')"); v != "0" {
		t.Fatalf("a process the interpreter starts inherits PYTHONMALLOC (%s times)", v)
	}
	thp, _ := os.ReadFile("/sys/kernel/mm/transparent_hugepage/enabled")
	if !strings.Contains(string(thp), "[madvise]") && !strings.Contains(string(thp), "[always]") {
		t.Skipf("transparent huge pages are off on this host: %s", thp)
	}
	value(t, s, id, "data = [{'k': i, 's': 'v%08d' % i} for i in range(300_000)]\nlen(data)")
	huge := 0
	for _, pid := range testserver.SandboxPids(id) {
		p := strconv.Itoa(pid)
		if cmd, _ := os.ReadFile("/proc/" + p + "/cmdline"); strings.HasPrefix(string(cmd), "python3") {
			huge = smapsKiB(t, p, "AnonHugePages:")
		}
	}
	if huge < 50<<10 {
		t.Fatalf("interpreter holding ~100 MB of dicts has %d KiB of huge pages, want >= 50 MiB", huge)
	}
}

func smapsKiB(t *testing.T, pid, field string) int {
	b, err := os.ReadFile("/proc/" + pid + "/smaps_rollup")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == field {
			n, _ := strconv.Atoi(f[1])
			return n
		}
	}
	return 0
}

// A fork child's garbage collection leaves the parent's objects shared: the objects a child inherits are out of
// its cyclic collector's reach, so a full collection in it (gc.collect() in user code or a library) neither
// copies the parent's heap nor takes the time to; the parent collects its own as before, and a session's own
// gc.freeze() is kept.
func TestForkChildGarbageCollectionKeepsTheParentsHeapShared(t *testing.T) {
	s := testserver.Start(t)
	ctx := ctxT(t)
	parent := create(t, s, &client.CreateRequest{MemMiB: 2048})
	value(t, s, parent, `import gc, weakref
data = [{'k': i, 's': 'v%08d' % i, 'l': [i]} for i in range(600_000)]
class Cycle: pass
c = Cycle(); c.me = c
collected = []
ref = weakref.ref(c, lambda _: collected.append(1))
len(data)`)
	kids, err := s.Client.Fork(ctx, parent, 1)
	if err != nil {
		t.Fatal(err)
	}
	kid := kids[0]
	value(t, s, kid, "gc.collect()\n1")
	var uss int
	for _, pid := range testserver.SandboxPids(kid) {
		p := strconv.Itoa(pid)
		if cmd, _ := os.ReadFile("/proc/" + p + "/cmdline"); strings.HasPrefix(string(cmd), "python3") {
			uss = smapsKiB(t, p, "Private_Clean:") + smapsKiB(t, p, "Private_Dirty:")
		}
	}
	if uss == 0 || uss > 30<<10 {
		t.Fatalf("the child's interpreter after gc.collect(): %d KiB private, want 1..30 MiB (the parent's heap is ~250 MiB)", uss)
	}
	// The child's own cycles are collected.
	if v := value(t, s, kid, "k = Cycle(); k.me = k\nkr = weakref.ref(k)\ndel k\ngc.collect()\nkr() is None"); v != "True" {
		t.Fatalf("a cycle the child made, dropped: collected %s", v)
	}
	// The parent's objects are its collector's again: a cycle it held at the fork is collected once dropped.
	if v := value(t, s, parent, "gc.get_freeze_count()"); v != "0" {
		t.Fatalf("the parent's frozen objects after the fork: %s, want 0", v)
	}
	if v := value(t, s, parent, "del c\ngc.collect()\ncollected"); v != "[1]" {
		t.Fatalf("a cycle the parent held at the fork, dropped and collected: %s, want [1]", v)
	}
	// A session that froze its objects itself keeps them frozen across a fork.
	n := value(t, s, parent, "gc.freeze()\ngc.get_freeze_count()")
	if _, err := s.Client.Fork(ctx, parent, 1); err != nil {
		t.Fatal(err)
	}
	if v := value(t, s, parent, "gc.get_freeze_count() > "+n+" // 2"); v != "True" {
		t.Fatalf("the session's own gc.freeze() after a fork: %s frozen, had %s", value(t, s, parent, "gc.get_freeze_count()"), n)
	}
}
