package sshd

import (
	"bytes"
	"io"
	"os"
	"path/filepath"
	"testing"
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
		w := &orderedWriter{pw: pw, pending: map[int64][]byte{}, done: make(chan error, 1)}
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
