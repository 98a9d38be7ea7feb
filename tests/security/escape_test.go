package security

import (
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ramify-dev/ramify/client"
	"github.com/ramify-dev/ramify/internal/testserver"
)

// The classic ways out of a container, tried as root in a sandbox: the family init's root, a chroot escape
// (root keeps CAP_SYS_CHROOT), devices, the host's block devices, kernel interfaces.
func TestEscapeAttempts(t *testing.T) {
	s := testserver.Start(t)
	id := s.Create(t, nil)
	host := s.Sh(t, id, "cat /etc/hostname").Stdout
	r := s.Sh(t, id, `ls /proc/1/root/ >/dev/null 2>&1 && echo "init root: listed" || echo "init root: refused"
python3 - <<'PY'
import os
# chroot escape: chroot into a subdirectory while keeping a handle on the outside, then climb.
os.makedirs("/tmp/jail", exist_ok=True)
out = os.open("/", os.O_RDONLY)
os.chroot("/tmp/jail")
os.fchdir(out)
for _ in range(64):
    os.chdir("..")
os.chroot(".")
print("after escape, hostname file:", open("/etc/hostname").read().strip())
print("after escape, root entries:", sorted(os.listdir("/"))[:6])
PY
ls /dev | tr '\n' ' '; echo
for d in /dev/vda /dev/sda /dev/mem /dev/kmsg /dev/loop0; do [ -e $d ] && echo "device present: $d"; done
mknod /tmp/vda b 254 0 2>/dev/null && echo "mknod: made" || echo "mknod: refused"
echo c > /proc/sysrq-trigger 2>/dev/null && echo "sysrq: written" || echo "sysrq: refused"
echo 1 > /proc/sys/vm/drop_caches 2>/dev/null && echo "sysctl: written" || echo "sysctl: refused"
true`)
	out := r.Stdout + r.Stderr
	t.Logf("%s", out)
	for _, want := range []string{"init root: refused", "after escape, hostname file: " + strings.TrimSpace(host), "mknod: refused", "sysrq: refused", "sysctl: refused"} {
		if !strings.Contains(out, want) {
			t.Errorf("missing %q", want)
		}
	}
	if strings.Contains(out, "device present") {
		t.Errorf("a host device is present in the sandbox")
	}
}

// A fork bomb and a memory hog in one sandbox leave a neighbour answering: its run_code latency is measured (and
// logged) while they run, and every call must succeed within a generous bound.
func TestNeighbourAnswersUnderForkBombAndMemoryHog(t *testing.T) {
	s := testserver.Start(t)
	victim := s.Create(t, nil)
	abuser := s.Create(t, &client.CreateRequest{MaxProcs: 64, MemMiB: 256})
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		to := 8                                                                                                                      // the timeout, not the command's end, stops the bomb: jobs an exec leaves running outlive it
		s.Client.Exec(testserver.Ctx(t), abuser, client.ExecRequest{Cmd: "bomb() { bomb | bomb & }; bomb; sleep 60", TimeoutS: &to}) //nolint:errcheck
	}()
	go func() {
		defer wg.Done()
		for i := 0; i < 3; i++ { // each run dies of OOM; the next starts a fresh interpreter
			s.Client.RunCode(testserver.Ctx(t), abuser, client.RunCodeRequest{Code: "b = bytearray(1 << 30); b[::4096] = b'x' * len(b[::4096])"}) //nolint:errcheck
		}
	}()
	var lat []time.Duration
	for i := 0; i < 40; i++ {
		start := time.Now()
		if v := s.Value(t, victim, "1 + 1"); v != "2" {
			t.Fatalf("neighbour: %q", v)
		}
		lat = append(lat, time.Since(start))
		time.Sleep(100 * time.Millisecond)
	}
	wg.Wait()
	sort.Slice(lat, func(i, j int) bool { return lat[i] < lat[j] })
	t.Logf("neighbour run_code under a fork bomb and a memory hog: p50 %v, p90 %v, max %v", lat[len(lat)/2], lat[len(lat)*9/10], lat[len(lat)-1])
	if lat[len(lat)-1] > 5*time.Second {
		t.Errorf("the neighbour stalled: max %v", lat[len(lat)-1])
	}
	if v := s.Value(t, abuser, "1 + 1"); v != "2" {
		t.Errorf("the abuser does not recover: %q", v)
	}
}
