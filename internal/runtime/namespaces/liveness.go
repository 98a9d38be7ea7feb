package namespaces

import (
	"context"
	"time"

	"golang.org/x/sys/unix"
)

// procKey names one process for good: its host pid and its start time (a reused pid has another).
type procKey struct {
	pid   int
	start uint64
}

// liveness tells which of ramify's processes (family inits, agents) have died, for the health watcher that asks
// every 500 ms. It keeps a pidfd per process, opened the first time the process is asked about (and checked
// against its start time then, so a reused pid is never watched), and answers with one poll(2) over all of them:
// a pidfd becomes readable when its process exits. Reading /proc/<pid>/stat twice per sandbox instead cost the
// server ~20% of a core at 1,000 sandboxes. Not safe for concurrent use: the runtime's lock guards it.
type liveness struct {
	fds map[procKey]int
}

// dead reports, for each key, whether its process is gone. Pidfds of processes no longer asked about are closed:
// keys is every process still watched.
func (l *liveness) dead(keys []procKey) map[procKey]bool {
	out, want := l.check(keys)
	for k, fd := range l.fds {
		if !want[k] {
			unix.Close(fd)
			delete(l.fds, k)
		}
	}
	return out
}

// check is dead for some of the processes watched: it closes no other's pidfd.
func (l *liveness) check(keys []procKey) (out, want map[procKey]bool) {
	if l.fds == nil {
		l.fds = map[procKey]int{}
	}
	out, want = map[procKey]bool{}, map[procKey]bool{}
	var polled []unix.PollFd
	var order []procKey
	for _, k := range keys {
		if want[k] {
			continue
		}
		want[k] = true
		fd, ok := l.fds[k]
		if !ok {
			var err error
			fd, err = unix.PidfdOpen(k.pid, 0)
			// Checked after the open, so the pidfd is known to be this process's (not a reused pid's).
			isAlive := alive(k.pid, k.start)
			if err != nil || !isAlive {
				if err == nil {
					unix.Close(fd)
				}
				out[k] = !isAlive // no pidfd (or not this process): /proc says
				continue
			}
			l.fds[k] = fd
		}
		polled = append(polled, unix.PollFd{Fd: int32(fd), Events: unix.POLLIN})
		order = append(order, k)
	}
	if len(polled) > 0 {
		for {
			if _, err := unix.Poll(polled, 0); err != unix.EINTR {
				break
			}
		}
		for i, p := range polled {
			out[order[i]] = p.Revents&(unix.POLLIN|unix.POLLHUP|unix.POLLERR|unix.POLLNVAL) != 0
		}
	}
	return out, want
}

// close releases every pidfd.
func (l *liveness) close() {
	for k, fd := range l.fds {
		unix.Close(fd)
		delete(l.fds, k)
	}
}

// portCheckEvery is how many health polls (Lost, every 500 ms) pass between two looks for running sandboxes whose
// host veth was deleted behind the server's back.
const portCheckEvery = 10

// checkPorts makes again the host veth of each running sandbox that two looks in a row found without one (an
// `ip link del` on the host takes the sandbox's eth0 with it: the sandbox ran on, cut off, and said nothing).
// Two looks, so that a veth between its sandbox's removal and the drop of its port is never taken for lost;
// network.Reattach checks the port under the lock Detach takes as well. Its processes are untouched.
func (r *Runtime) checkPorts() {
	defer r.checking.Store(false)
	missing, err := r.cfg.Network.MissingPorts()
	if err != nil {
		r.log.Debug("look for deleted host veths", "err", err)
		return
	}
	type lostPort struct {
		id, veth string
		netFD    int // a duplicate of the sandbox's: a destroy may close its own meanwhile
	}
	var work []lostPort
	r.mu.Lock()
	prev := r.portsGone
	r.portsGone = make(map[string]bool, len(missing))
	if len(missing) > 0 {
		byVeth := make(map[string]*sandbox, len(r.sandboxes))
		for _, sb := range r.sandboxes {
			byVeth[vethOf(sb.h)] = sb
		}
		for _, v := range missing {
			r.portsGone[v] = true
			sb := byVeth[v]
			if sb == nil || !prev[v] || sb.netFD <= 0 {
				continue
			}
			if fd, err := unix.FcntlInt(uintptr(sb.netFD), unix.F_DUPFD_CLOEXEC, 0); err == nil {
				work = append(work, lostPort{sb.h.ID, v, fd})
			}
		}
	}
	r.mu.Unlock()
	for _, w := range work {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err := r.cfg.Network.Reattach(ctx, w.netFD, w.veth)
		cancel()
		unix.Close(w.netFD)
		if err != nil {
			r.log.Error("a sandbox's host veth was deleted from outside the server, and making it again failed",
				"sandbox", w.id, "veth", w.veth, "err", err)
			continue
		}
		r.log.Warn("a sandbox's host veth was deleted from outside the server; made again", "sandbox", w.id, "veth", w.veth)
	}
}
