package sshd

import (
	"bufio"
	"bytes"
	"errors"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestHostKeyIsGeneratedOnceAndKept(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "ssh")
	first, err := LoadOrCreateHostKey(dir)
	if err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(filepath.Join(dir, HostKeyFile))
	if err != nil || st.Mode().Perm() != 0o600 {
		t.Fatalf("host key file: %v, %v", st, err)
	}
	if first.PublicKey().Type() != "ssh-ed25519" {
		t.Fatalf("host key type %s", first.PublicKey().Type())
	}
	again, err := LoadOrCreateHostKey(dir)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(first.PublicKey().Marshal(), again.PublicKey().Marshal()) {
		t.Fatal("a second start made a new host key")
	}
	// A damaged key is an error, never silently replaced (clients would see a changed host key).
	os.WriteFile(filepath.Join(dir, HostKeyFile), []byte("garbage"), 0o600)
	if _, err := LoadOrCreateHostKey(dir); err == nil {
		t.Fatal("a damaged host key was accepted")
	}
}

func TestOrderedWriterReordersAndRefusesGaps(t *testing.T) {
	var got bytes.Buffer
	run := func(writes [][2]any) error {
		got.Reset()
		pr, pw := io.Pipe()
		w := newOrderedWriter(pw)
		go func() {
			_, err := got.ReadFrom(pr)
			w.done <- err
		}()
		for _, wr := range writes {
			if _, err := w.WriteAt([]byte(wr[0].(string)), int64(wr[1].(int))); err != nil {
				return err
			}
		}
		return w.Close()
	}
	if err := run([][2]any{{"cd", 2}, {"ab", 0}, {"ef", 4}}); err != nil || got.String() != "abcdef" {
		t.Fatalf("out of order: %q, %v", got.String(), err)
	}
	if err := run([][2]any{{"ab", 0}, {"ef", 4}}); err == nil {
		t.Fatalf("a write with a gap succeeded: %q", got.String())
	}
}

// Clients that connect and say nothing hold at most maxHandshakes connections: the next one is closed at once,
// and once they go, a client gets the server's version line again.
func TestSilentClientsAreBounded(t *testing.T) {
	s, err := New(nil, t.TempDir(), nil)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go s.Serve(ln) //nolint:errcheck // ends with Close
	defer s.Close()
	var silent []net.Conn
	defer func() {
		for _, c := range silent {
			c.Close()
		}
	}()
	readVersion := func(c net.Conn) (string, error) {
		c.SetReadDeadline(time.Now().Add(5 * time.Second))
		line, err := bufio.NewReader(c).ReadString('\n')
		return line, err
	}
	for i := 0; i < maxHandshakes; i++ {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		silent = append(silent, c)
		if line, err := readVersion(c); err != nil || !strings.HasPrefix(line, "SSH-2.0-ramify") {
			t.Fatalf("connection %d: %q %v", i, line, err)
		}
	}
	extra, err := net.Dial("tcp", ln.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer extra.Close()
	if line, err := readVersion(extra); err == nil {
		t.Fatalf("connection past the limit was served: %q", line)
	}
	for _, c := range silent {
		c.Close()
	}
	silent = nil
	deadline := time.Now().Add(5 * time.Second)
	for {
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		line, err := readVersion(c)
		c.Close()
		if err == nil && strings.HasPrefix(line, "SSH-2.0-ramify") {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no handshake after the silent clients left: %q %v", line, err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// An sftp upload whose client sends nothing for uploadIdle ends (its pipe fails, so the files write gives up
// and the sandbox is released); one that keeps sending, however slowly in all, is not cut off.
func TestUploadIdleEnds(t *testing.T) {
	defer func(d time.Duration) { uploadIdle = d }(uploadIdle)
	uploadIdle = 150 * time.Millisecond
	for _, steady := range []bool{false, true} {
		pr, pw := io.Pipe()
		w := newUpload(pw)
		read := make(chan error, 1)
		go func() {
			_, err := io.Copy(io.Discard, pr)
			read <- err
		}()
		var off int64
		for deadline := time.Now().Add(5 * uploadIdle); steady && time.Now().Before(deadline); {
			if _, err := w.WriteAt(make([]byte, 100), off); err != nil {
				t.Fatalf("a steady upload failed: %v", err)
			}
			off += 100
			time.Sleep(uploadIdle / 5)
		}
		if steady {
			w.done <- nil // what the files write would answer
			w.Close()
		}
		select {
		case err := <-read:
			if steady && err != nil || !steady && !errors.Is(err, errUploadIdle) {
				t.Errorf("steady %v: the upload's read ended with %v", steady, err)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("steady %v: a silent upload was not ended", steady)
		}
		if !steady {
			if _, err := w.WriteAt([]byte("late"), 0); err == nil {
				t.Errorf("a write after the idle end succeeded")
			}
		}
	}
}
