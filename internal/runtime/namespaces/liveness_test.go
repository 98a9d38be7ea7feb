package namespaces

import (
	"os/exec"
	"testing"
)

// A process is alive until it exits (a zombie counts as dead: it can no longer answer), a key whose start time is
// not the process's is dead, and pidfds of processes no longer asked about are closed.
func TestLiveness(t *testing.T) {
	cmd := exec.Command("sleep", "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	start, err := procStart(cmd.Process.Pid)
	if err != nil {
		t.Fatal(err)
	}
	var l liveness
	defer l.close()
	k := procKey{cmd.Process.Pid, start}
	wrong := procKey{cmd.Process.Pid, start + 1}
	d := l.dead([]procKey{k, wrong})
	if d[k] || !d[wrong] {
		t.Fatalf("live process: %v", d)
	}
	if len(l.fds) != 1 {
		t.Fatalf("watched %d pidfds, want 1", len(l.fds))
	}
	cmd.Process.Kill()
	cmd.Process.Wait() //nolint:errcheck
	if d := l.dead([]procKey{k}); !d[k] {
		t.Fatalf("killed process still alive: %v", d)
	}
	if d := l.dead(nil); len(d) != 0 || len(l.fds) != 0 {
		t.Fatalf("pidfds kept after nothing was asked: %v %d", d, len(l.fds))
	}
}
