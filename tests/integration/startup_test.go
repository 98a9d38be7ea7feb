package integration

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ramify-dev/ramify/internal/testserver"
)

// sandboxCgroups returns the sandbox cgroups (one hierarchy's) of the server on dataDir, each with its pids.
func sandboxCgroups(dataDir string) map[string]string {
	sum := sha256.Sum256([]byte(dataDir))
	pattern := "/sys/fs/cgroup/pids/ramify/" + hex.EncodeToString(sum[:4]) + "/sbx_*/cgroup.procs"
	if _, err := os.Stat("/sys/fs/cgroup/pids"); err != nil {
		pattern = "/sys/fs/cgroup/ramify/" + hex.EncodeToString(sum[:4]) + "/sbx_*/cgroup.procs"
	}
	files, _ := filepath.Glob(pattern)
	out := map[string]string{}
	for _, f := range files {
		b, _ := os.ReadFile(f)
		pids := strings.Fields(string(b))
		sort.Strings(pids)
		out[filepath.Base(filepath.Dir(f))] = strings.Join(pids, ",")
	}
	return out
}

// A second `ramify serve` on a data directory in use exits at once, naming the first server's pid, and touches
// none of the first server's sandboxes: not the created one, not the warm pool's.
func TestSecondServerOnSameDataDir(t *testing.T) {
	s := testserver.Start(t, "--warm-pool", "1")
	id := s.Create(t, nil)
	s.Value(t, id, "x = 41")
	// The created sandbox and one warm one (the pool refills after the create).
	deadline := time.Now().Add(60 * time.Second)
	var before map[string]string
	for {
		before = sandboxCgroups(s.DataDir)
		if len(before) >= 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the warm pool did not refill: sandbox cgroups %v", before)
		}
		time.Sleep(50 * time.Millisecond)
	}
	u, err := url.Parse(s.URL)
	if err != nil {
		t.Fatal(err)
	}
	images := os.Getenv("RAMIFY_TEST_IMAGE_DIR")
	if images == "" {
		images = "/var/cache/ramify/images"
	}
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	// The same port too: before the lock, the second server recovered (destroyed) the first one's sandboxes and
	// only then failed on the port.
	args := []string{"serve", "--listen", u.Host, "--data-dir", s.DataDir, "--image-dir", images, "--api-key", "other",
		"--bridge", "rfyt2nd" + strconv.Itoa(os.Getpid()%1000), "--subnet", "10.219.254.0/24", "--warm-pool", "0"}
	if rb := os.Getenv("RAMIFY_TEST_RUNTIME_BINARY"); rb != "" {
		args = append(args, "--runtime-binary", rb)
	}
	out, err := exec.CommandContext(ctx, testserver.Binary(t), args...).CombinedOutput()
	t.Cleanup(func() { exec.Command("ip", "link", "del", args[11]).Run() })
	want := "data directory " + s.DataDir + " is in use by ramify serve (pid " + strconv.Itoa(s.Pid()) + ")"
	if err == nil || !strings.Contains(string(out), want) {
		t.Errorf("second server: %v\n%s\nwant a failure saying %q", err, out, want)
	}
	after := sandboxCgroups(s.DataDir)
	for sb, pids := range before {
		if after[sb] != pids {
			t.Errorf("sandbox %s: processes %q before the second server, %q after", sb, pids, after[sb])
		}
	}
	if got := s.Value(t, id, "x + 1"); got != "42" {
		t.Errorf("the first server's sandbox lost its state: x + 1 = %s", got)
	}
}

// loopsOf returns the loop devices whose backing file is img.
func loopsOf(img string) []string {
	files, _ := filepath.Glob("/sys/block/loop*/loop/backing_file")
	var out []string
	for _, f := range files {
		b, _ := os.ReadFile(f)
		if strings.TrimSuffix(strings.TrimSpace(string(b)), " (deleted)") == img {
			out = append(out, "/dev/"+filepath.Base(filepath.Dir(filepath.Dir(f))))
		}
	}
	return out
}

// mountsUnder returns the mount points below dir in /proc/self/mountinfo.
func mountsUnder(dir string) []string {
	b, _ := os.ReadFile("/proc/self/mountinfo")
	var out []string
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) > 4 && strings.HasPrefix(f[4], dir+"/") {
			out = append(out, f[4])
		}
	}
	return out
}

// A `ramify serve` that fails at start after mounting its layer image and making its cgroup parent (here: on an
// invalid --subnet, checked by the network step that comes after them) unmounts it, leaves no loop device attached
// and removes the cgroup parent it made.
func TestFailedStartUnwindsLayerMount(t *testing.T) {
	bin := testserver.Binary(t)
	if _, err := os.Stat("/dev/loop-control"); err != nil {
		t.Skip("no loop devices")
	}
	if _, err := exec.LookPath("mkfs.btrfs"); err != nil {
		t.Skip("no mkfs.btrfs")
	}
	images := os.Getenv("RAMIFY_TEST_IMAGE_DIR")
	if images == "" {
		images = "/var/cache/ramify/images"
	}
	if _, err := os.Stat(filepath.Join(images, "default", "manifest.json")); err != nil {
		t.Skipf("no test image in %s", images)
	}
	dataDir := t.TempDir()
	mnt := filepath.Join(dataDir, "layers", "layers")
	img := filepath.Join(dataDir, "layers", "layers.img")
	t.Cleanup(func() { // whatever the outcome, leave nothing behind
		sum := sha256.Sum256([]byte(dataDir))
		cgs, _ := filepath.Glob("/sys/fs/cgroup/*/ramify/" + hex.EncodeToString(sum[:4]))
		for _, d := range append(cgs, "/sys/fs/cgroup/ramify/"+hex.EncodeToString(sum[:4])) {
			os.Remove(d) // empty: no sandbox was started
		}
		unix.Unmount(mnt, unix.MNT_DETACH)
		for _, dev := range loopsOf(img) {
			if fd, err := unix.Open(dev, unix.O_RDONLY|unix.O_CLOEXEC, 0); err == nil {
				unix.IoctlSetInt(fd, unix.LOOP_CLR_FD, 0)
				unix.Close(fd)
			}
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
	defer cancel()
	args := []string{"serve", "--listen", "127.0.0.1:0", "--data-dir", dataDir, "--image-dir", images, "--api-key", "k",
		"--layer-driver", "btrfs", "--subnet", "not-a-subnet", "--bridge", "rfyt-unused", "--warm-pool", "0"}
	if rb := os.Getenv("RAMIFY_TEST_RUNTIME_BINARY"); rb != "" {
		args = append(args, "--runtime-binary", rb)
	}
	out, err := exec.CommandContext(ctx, bin, args...).CombinedOutput()
	if err == nil || !strings.Contains(string(out), "network") {
		t.Fatalf("serve with an invalid subnet: %v\n%s\nwant a start-up failure in the network step", err, out)
	}
	if strings.Contains(string(out), "data directory's own btrfs") {
		t.Skip("the test's data directory is on btrfs: layers are not loop-mounted, nothing to unwind")
	}
	if !strings.Contains(string(out), "btrfs layer driver on a new image") {
		t.Fatalf("the server failed before mounting its layer image, nothing to check:\n%s", out)
	}
	if m := mountsUnder(dataDir); len(m) != 0 {
		t.Errorf("mounts left after the failed start: %v", m)
	}
	sum := sha256.Sum256([]byte(dataDir))
	if cgs, _ := filepath.Glob("/sys/fs/cgroup/*/ramify/" + hex.EncodeToString(sum[:4])); len(cgs) != 0 {
		t.Errorf("cgroups left after the failed start: %v", cgs)
	}
	// The loop device detaches itself (autoclear) when the unmount releases it; give the kernel a moment.
	var loops []string
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		if loops = loopsOf(img); len(loops) == 0 || time.Now().After(deadline) {
			break
		}
	}
	if len(loops) != 0 {
		t.Errorf("loop devices left attached to %s after the failed start: %v", img, loops)
	}
}

// TestSandboxesRunTheGuestProgram: a server built by make build runs its embedded in-sandbox program, not
// itself, as family init and agents (a fresh sandbox's, a fork child's and a spare's): each runs from a sealed
// memfd a fraction of the server binary's size. A binary built with a plain go build has none (see
// cmd/ramify/embedded/README.md): build the one under test with make build.
func TestSandboxesRunTheGuestProgram(t *testing.T) {
	s := testserver.Start(t)
	server, err := os.Stat(testserver.Binary(t))
	if err != nil {
		t.Fatal(err)
	}
	id := create(t, s, nil)
	value(t, s, id, "1")
	kids, err := s.Client.Fork(ctxT(t), id, 1)
	if err != nil {
		t.Fatal(err)
	}
	value(t, s, kids[0], "1")
	check := func(what string, pid int) {
		t.Helper()
		exe, _ := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid))
		st, err := os.Stat(fmt.Sprintf("/proc/%d/exe", pid))
		if err != nil || !strings.HasPrefix(exe, "/memfd:ramify") {
			t.Fatalf("%s (pid %d) runs %q (%v), want the sealed memfd", what, pid, exe, err)
		}
		if st.Size() > server.Size()/3 {
			t.Fatalf("%s (pid %d) runs a %d-byte program, the server's own binary is %d bytes: the in-sandbox program "+
				"is not embedded (build the binary under test with make build)", what, pid, st.Size(), server.Size())
		}
	}
	for _, sb := range []string{id, kids[0]} {
		pid := testserver.AgentPid(sb)
		if pid == 0 {
			t.Fatalf("no agent found for %s", sb)
		}
		check("agent of "+sb, pid)
	}
	inits := s.Inventory().Inits
	if len(inits) == 0 {
		t.Fatal("no family init found")
	}
	for _, pid := range inits {
		check("family init", pid)
	}
}

// A sandbox whose agent does not answer (stopped from the host) does not hold up the server's start: it is
// recovered as it runs, the other sandboxes answer as soon as the server is up, and it answers again once its
// agent runs again. Before, the start waited on its agent's ping for as long as it was stopped.
func TestStartNotHeldUpByAStoppedAgent(t *testing.T) {
	s := testserver.Start(t)
	stuck := create(t, s, nil)
	value(t, s, stuck, "x = 1")
	other := create(t, s, nil)
	value(t, s, other, "y = 2")
	cont := stopAgent(t, stuck)
	start := time.Now()
	s.Restart()
	if took := time.Since(start); took > 30*time.Second {
		t.Errorf("the server took %v to start with a stopped agent", took)
	}
	if got := value(t, s, other, "y"); got != "2" {
		t.Fatalf("another sandbox after the restart: y = %s", got)
	}
	cont()
	if got := value(t, s, stuck, "x"); got != "1" {
		t.Fatalf("the sandbox whose agent was stopped, once it runs again: x = %s", got)
	}
}
