package agent

import (
	"bytes"
	"os"
	"testing"

	"golang.org/x/sys/unix"
)

// TestRecvPacket: a message of the init's channel or a spare's claim comes whole, whatever its size (a fixed
// buffer held 64 KiB), with the descriptor passed along; the peer's close is an empty message.
func TestRecvPacket(t *testing.T) {
	fds, err := unix.Socketpair(unix.AF_UNIX, unix.SOCK_SEQPACKET|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer unix.Close(fds[0])
	for _, size := range []int{1, 4096, 100 << 10} {
		msg := bytes.Repeat([]byte{'x'}, size)
		msg[size-1] = 'y'
		f, err := os.Open("/dev/null")
		if err != nil {
			t.Fatal(err)
		}
		if err := unix.Sendmsg(fds[1], msg, unix.UnixRights(int(f.Fd())), nil, 0); err != nil {
			t.Fatal(err)
		}
		f.Close()
		oob := make([]byte, unix.CmsgSpace(4))
		got, oobn, err := recvPacket(fds[0], oob, unix.MSG_CMSG_CLOEXEC)
		if err != nil {
			t.Fatal(err)
		}
		if !bytes.Equal(got, msg) {
			t.Fatalf("size %d: received %d bytes, not the message", size, len(got))
		}
		passed := Rights(oob[:oobn])
		if len(passed) != 1 {
			t.Fatalf("size %d: %d descriptors passed, want 1", size, len(passed))
		}
		unix.Close(passed[0])
	}
	unix.Close(fds[1])
	got, oobn, err := recvPacket(fds[0], nil, 0)
	if err != nil || len(got) != 0 || oobn != 0 {
		t.Fatalf("after the peer closed: %q, %d, %v; want an empty message", got, oobn, err)
	}
}
