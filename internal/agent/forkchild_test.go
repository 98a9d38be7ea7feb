package agent

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"os"
	"runtime"
	"testing"
)

// TestForkChildHelperIsCurrent: the embedded fork child helper was built from forkchild/forkchild.c as it is
// (scripts/build-forkchild writes the source's SHA-256 into it); after a change to the source, run that script.
func TestForkChildHelperIsCurrent(t *testing.T) {
	if runtime.GOARCH != "amd64" {
		t.Skip("the helper is built for amd64 only")
	}
	src, err := os.ReadFile("forkchild/forkchild.c")
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256(src)
	want := "ramify-fork-child-source-sha256:" + hex.EncodeToString(sum[:])
	if !bytes.Contains(forkChildHelper, []byte(want)) {
		t.Fatalf("forkchild_amd64.so was not built from forkchild.c as it is now: run scripts/build-forkchild")
	}
}
