package cgroups

import (
	"bufio"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"
)

// warmPeriod is how often a kept-warm lock is taken: well within a grace period (~8 ms here, more on a busy
// host), after which the kernel's rcu_sync would return the lock to its idle state.
const warmPeriod = 3 * time.Millisecond

// moveWarmer keeps the cgroup thread-group lock's writer side warm (see MoveWarmer) by having this process
// "move" itself into the cgroup it is already in, in one hierarchy, every warmPeriod: the write takes the lock
// for writing and migrates nothing.
type moveWarmer struct {
	mu      sync.Mutex
	holders int
	running bool
	failed  bool // the self-move failed once: warming is off for good (moves stay correct, only slower)
}

// KeepMovesFast implements MoveWarmer.
func (m *v1Manager) KeepMovesFast() func() {
	w := &m.warm
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.failed {
		return func() {}
	}
	w.holders++
	if !w.running {
		w.running = true
		go m.keepWarm()
	}
	var once sync.Once
	return func() {
		once.Do(func() {
			w.mu.Lock()
			w.holders--
			w.mu.Unlock()
		})
	}
}

func (m *v1Manager) keepWarm() {
	w := &m.warm
	stop := func(err error) {
		w.mu.Lock()
		w.running = false
		if err != nil {
			w.failed = true
		}
		w.mu.Unlock()
		if err != nil {
			m.log.Warn("cannot keep cgroup moves fast; each move after a pause waits for an RCU grace period", "err", err)
		}
	}
	procs, err := ownProcsFile(m.mounts["pids"], "pids")
	if err != nil {
		stop(err)
		return
	}
	f, err := os.OpenFile(procs, os.O_WRONLY, 0)
	if err != nil {
		stop(err)
		return
	}
	defer f.Close()
	for {
		// "0" is the writing process itself, which is already there.
		if _, err := f.Write([]byte("0")); err != nil {
			stop(fmt.Errorf("write %s: %w", procs, err))
			return
		}
		time.Sleep(warmPeriod)
		w.mu.Lock()
		if w.holders == 0 {
			w.running = false
			w.mu.Unlock()
			return
		}
		w.mu.Unlock()
	}
}

// ownProcsFile is the cgroup.procs file of the cgroup this process is in, in the hierarchy of controller ctrl
// mounted at mount.
func ownProcsFile(mount, ctrl string) (string, error) {
	f, err := os.Open("/proc/self/cgroup")
	if err != nil {
		return "", err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// 5:pids:/user.slice/user-0.slice/session-1.scope
		parts := strings.SplitN(sc.Text(), ":", 3)
		if len(parts) != 3 {
			continue
		}
		for _, c := range strings.Split(parts[1], ",") {
			if c == ctrl {
				return filepath.Join(mount, filepath.Clean("/"+parts[2]), "cgroup.procs"), nil
			}
		}
	}
	if err := sc.Err(); err != nil {
		return "", err
	}
	return "", fmt.Errorf("this process is in no %s cgroup", ctrl)
}
