package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// A second server on a data directory in use is refused, naming the first one's pid; the lock goes with the
// first one.
func TestLockDataDir(t *testing.T) {
	dir := t.TempDir()
	first, err := lockDataDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	_, err = lockDataDir(dir)
	want := "data directory " + dir + " is in use by ramify serve (pid " + strconv.Itoa(os.Getpid()) + ")"
	if err == nil || err.Error() != want {
		t.Fatalf("second lock: %v; want %q", err, want)
	}
	first.Close()
	again, err := lockDataDir(dir)
	if err != nil {
		t.Fatalf("lock after release: %v", err)
	}
	again.Close()
}

// A dynamically linked runtime binary (a plain `go build` with cgo) is refused at start with the fix named; a
// static one is accepted.
func TestCheckRuntimeBinaryDynamic(t *testing.T) {
	if _, err := exec.LookPath("gcc"); err != nil {
		t.Skip("no gcc: cannot build a cgo (dynamically linked) binary to check")
	}
	dir := t.TempDir()
	src := filepath.Join(dir, "main.go")
	if err := os.WriteFile(src, []byte("package main\n\nimport \"net\"\n\nfunc main() { _, _ = net.LookupHost(\"localhost\") }\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	build := func(cgo, out string) string {
		cmd := exec.Command("go", "build", "-o", out, src)
		cmd.Dir = dir
		cmd.Env = append(os.Environ(), "CGO_ENABLED="+cgo, "GOFLAGS=")
		if b, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("go build CGO_ENABLED=%s: %v\n%s", cgo, err, b)
		}
		return out
	}
	dyn := build("1", filepath.Join(dir, "dyn"))
	if ok, _, _ := dynamicallyLinked(dyn); !ok {
		t.Skip("the cgo build came out static on this host: nothing to check")
	}
	err := checkRuntimeBinary(dyn, true) // a binary given is checked even when this one embeds a program
	if err == nil || !strings.Contains(err.Error(), "dynamically linked") || !strings.Contains(err.Error(), "CGO_ENABLED=0 go build") {
		t.Fatalf("dynamic binary: %v; want a refusal naming CGO_ENABLED=0 go build", err)
	}
	static := build("0", filepath.Join(dir, "static"))
	if err := checkRuntimeBinary(static, false); err != nil {
		t.Fatalf("static binary refused: %v", err)
	}
}

// The key is saved once and reported by where it is on later starts.
func TestLoadOrCreateKey(t *testing.T) {
	dir := t.TempDir()
	k1, src, err := loadOrCreateKey(dir, "")
	if err != nil || src != keyGenerated || !strings.HasPrefix(k1, "rfy_") {
		t.Fatalf("first: %q %v %v", k1, src, err)
	}
	k2, src, err := loadOrCreateKey(dir, "")
	if err != nil || src != keyFromFile || k2 != k1 {
		t.Fatalf("second: %q %v %v", k2, src, err)
	}
	if k, src, _ := loadOrCreateKey(dir, "given"); k != "given" || src != keyGiven {
		t.Fatalf("given: %q %v", k, src)
	}
}
