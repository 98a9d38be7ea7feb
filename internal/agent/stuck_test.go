package agent

import (
	"os/exec"
	"testing"
	"time"
)

// replaceStuck kills the interpreter only while the save or fork it serves (tracked) is still unanswered after
// the grace: not when none runs, not when it ends within the grace, and never an interpreter started after it.
func TestReplaceStuck(t *testing.T) {
	p := &repl{}
	if p.replaceStuck(10 * time.Millisecond) {
		t.Fatal("replaced with no save or fork in flight")
	}
	interp := exec.Command("sleep", "60") // stands in for the interpreter
	if err := interp.Start(); err != nil {
		t.Fatal(err)
	}
	defer interp.Process.Kill()
	exited := make(chan error, 1)
	go func() { exited <- interp.Wait() }()
	p.pid = interp.Process.Pid

	// Answered within the grace: kept.
	go p.tracked(func() (replMsg, error) { time.Sleep(50 * time.Millisecond); return replMsg{}, nil }) //nolint:errcheck
	time.Sleep(10 * time.Millisecond)
	if p.replaceStuck(2 * time.Second) {
		t.Fatal("replaced an interpreter that answered within the grace")
	}

	// Still silent after the grace: killed.
	release := make(chan struct{})
	defer close(release)
	go p.tracked(func() (replMsg, error) { <-release; return replMsg{}, nil }) //nolint:errcheck
	time.Sleep(10 * time.Millisecond)
	if !p.replaceStuck(50 * time.Millisecond) {
		t.Fatal("a silent interpreter was not replaced")
	}
	select {
	case <-exited:
	case <-time.After(5 * time.Second):
		t.Fatal("the silent interpreter was not killed")
	}
}
