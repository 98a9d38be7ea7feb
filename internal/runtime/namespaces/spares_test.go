package namespaces

import (
	"os"
	"os/exec"
	"testing"
	"time"
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
