package snapstore

import (
	"testing"
	"unsafe"

	"golang.org/x/sys/unix"
)

// TestAlignedBuffer: a direct I/O buffer is 2 MiB-aligned (so that it can be backed by huge pages), writable in
// full, with nothing of the room reserved to align it left mapped after it, and gone once freed.
func TestAlignedBuffer(t *testing.T) {
	b, err := alignedBuffer(directChunk)
	if err != nil {
		t.Fatal(err)
	}
	base := unsafe.Pointer(unsafe.SliceData(b))
	addr := uintptr(base)
	mapped := func(at uintptr) bool { // the page at base+at (msync fails with ENOMEM where nothing is mapped)
		return unix.Msync(unsafe.Slice((*byte)(unsafe.Add(base, at)), 4096), unix.MS_ASYNC) == nil
	}
	if addr%hugePage != 0 || len(b) != directChunk || cap(b) != directChunk {
		t.Fatalf("buffer at %#x, len %d, cap %d: want 2 MiB-aligned, %d bytes", addr, len(b), cap(b), directChunk)
	}
	for i := 0; i < len(b); i += 4096 {
		b[i] = 1
	}
	b[len(b)-1] = 1
	if mapped(directChunk) {
		t.Errorf("the page after the buffer is mapped: the room reserved to align it was left")
	}
	freeBuffer(b)
	for off := uintptr(0); off < directChunk; off += hugePage {
		if mapped(off) {
			t.Fatalf("%#x is still mapped after freeBuffer", addr+off)
		}
	}
}
