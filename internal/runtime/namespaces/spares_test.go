package namespaces

import (
	"os"
	"os/exec"
	"slices"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

func TestReserveMaxAge(t *testing.T) {
	for _, c := range []struct{ idle, want time.Duration }{
		{0, 0},
		{-time.Second, 0},
		{5 * time.Minute, 5*time.Minute - 10*time.Second},
		{12 * time.Second, 6 * time.Second},
		{2 * time.Second, time.Second},
	} {
		if got := reserveMaxAge(c.idle); got != c.want {
			t.Errorf("reserveMaxAge(%v) = %v, want %v", c.idle, got, c.want)
		}
	}
}

// TestSparePoolReserve: a fork gets a spare per child or none; dead spares and spares near their idle limit are
// passed over; what it takes is claimed (never placed again) and gone from the pool.
func TestSparePoolReserve(t *testing.T) {
	dead := exec.Command("true")
	if err := dead.Run(); err != nil {
		t.Skip(err)
	}
	now := time.Now()
	p := &sparePool{placed: map[int]placedSpare{
		2: {nsPid: 2, hostPid: os.Getpid(), at: now},
		3: {nsPid: 3, hostPid: os.Getpid(), at: now},
		4: {nsPid: 4, hostPid: dead.Process.Pid, at: now},            // gone
		5: {nsPid: 5, hostPid: os.Getpid(), at: now.Add(-time.Hour)}, // about to retire
	}}
	if got := p.reserve(3, time.Minute); got != nil {
		t.Fatalf("reserve(3) = %v, want none: only two spares are alive and young", got)
	}
	if len(p.placed) != 4 || len(p.claimed) != 0 {
		t.Fatalf("a reserve that failed took spares: placed %v, claimed %v", p.placed, p.claimed)
	}
	got := p.reserve(2, time.Minute)
	if len(got) != 2 || got[0].nsPid+got[1].nsPid != 5 {
		t.Fatalf("reserve(2) = %v, want spares 2 and 3", got)
	}
	if _, ok := p.placed[2]; ok || !p.claimed[2] || !p.claimed[3] {
		t.Fatalf("reserved spares still placed or not claimed: placed %v, claimed %v", p.placed, p.claimed)
	}
	if got := p.reserve(1, 0); len(got) != 1 || got[0].nsPid != 5 {
		t.Fatalf("reserve(1) without an age limit = %v, want spare 5", got)
	}
	if n := p.usable(0); n != 0 {
		t.Fatalf("usable(0) = %d with only a dead spare left, want 0", n)
	}
	p.placed[6] = placedSpare{nsPid: 6, hostPid: os.Getpid(), at: now}
	p.placed[7] = placedSpare{nsPid: 7, hostPid: os.Getpid(), at: now.Add(-time.Hour)}
	if n, all := p.usable(time.Minute), p.usable(0); n != 1 || all != 2 {
		t.Fatalf("usable = %d (age limit) and %d (none), want 1 and 2", n, all)
	}
}

// TestDropSpare: a spare reaped by the init leaves its idle list at once (its pid may be reused from then on),
// with its claim socket closed; the other spares stay.
func TestDropSpare(t *testing.T) {
	var fds [2][2]int
	for i := range fds {
		var err error
		if fds[i], err = unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0); err != nil {
			t.Fatal(err)
		}
		defer unix.Close(fds[i][1])
	}
	spares.Lock()
	saved := spares.idle
	spares.idle = []spareAgent{{pid: 41, claim: fds[0][0]}, {pid: 42, claim: fds[1][0]}}
	spares.Unlock()
	defer func() {
		spares.Lock()
		spares.idle = saved
		spares.Unlock()
		unix.Close(fds[1][0])
	}()
	dropSpare(41)
	dropSpare(7) // not a spare: nothing happens
	spares.Lock()
	idle := slices.Clone(spares.idle)
	spares.Unlock()
	if len(idle) != 1 || idle[0].pid != 42 {
		t.Fatalf("idle spares after dropping 41: %+v, want only 42", idle)
	}
	// The dropped spare's end of its claim socket is closed: the spare (were it alive) would see end of file.
	if n, err := unix.Read(fds[0][1], make([]byte, 1)); n != 0 || err != nil {
		t.Fatalf("read from the dropped spare's claim socket = %d, %v; want end of file", n, err)
	}
}
