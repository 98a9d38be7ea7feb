package agent

import (
	"runtime"
	"runtime/metrics"
	"testing"
)

// TestIdleReleaseArming: calls during set-up arm nothing; after it, the end of the last call arms the release and
// a call that begins puts it off.
func TestIdleReleaseArming(t *testing.T) {
	var r idleRelease
	r.begin()
	r.end()
	if r.timer != nil {
		t.Fatal("a call during set-up armed the release")
	}
	r.ready()
	r.begin()
	r.begin()
	r.end()
	if r.timer != nil {
		t.Fatal("armed while a call is still in progress")
	}
	r.end()
	if r.timer == nil {
		t.Fatal("the last call's end did not arm the release")
	}
	r.begin()
	if r.timer.Stop() {
		t.Fatal("a call began, yet the release was still armed")
	}
}

// TestIdleReleaseReturnsGarbage: once the collector has run, an idle agent holding much more heap than was live
// returns it to the host; one holding little does nothing.
func TestIdleReleaseReturnsGarbage(t *testing.T) {
	released := func() uint64 {
		s := []metrics.Sample{{Name: "/memory/classes/heap/released:bytes"}}
		metrics.Read(s)
		return s[0].Value.Uint64()
	}
	var r idleRelease
	r.ready()
	runtime.GC()
	for range 128 {
		sink = make([]byte, 64<<10) // 8 MiB of garbage, collected as it comes (the heap's goal is 4 MiB)
	}
	sink = nil
	before := released()
	r.release()
	if got := released(); got < before+2<<20 {
		t.Fatalf("released %d bytes, want the garbage's (MiBs)", int64(got)-int64(before))
	}
	runtime.GC()
	before = released()
	r.release()
	if got := released(); got > before+releaseMin {
		t.Fatalf("released %d bytes with nothing to return", got-before)
	}
}

var sink []byte
