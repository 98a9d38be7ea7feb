// Package testserver starts a real ramify server for integration tests and benchmarks: the built binary
// (RAMIFY_TEST_BINARY), a fresh data directory, the shared test image (RAMIFY_TEST_IMAGE_DIR), its own bridge and
// subnet, a free loopback port. Tests that cannot have these skip with the reason; nothing is mocked.
package testserver

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/ramify-dev/ramify/client"
	"golang.org/x/sys/unix"
)

// Server is a running ramify server.
type Server struct {
	URL, Key, DataDir string
	Client            *client.Client

	t       testing.TB
	bin     string
	args    []string
	cmd     *exec.Cmd
	logf    *os.File
	bridge  string
	extra   []*os.File    // descriptors the server inherits (see StartInheriting)
	env     []string      // added to the server's environment (RestartCrashingAt)
	exited  chan struct{} // closed when the server process has exited
	release func()        // gives its id (bridge, subnet) back, once cleanup has removed them
}

// serverIDs is how many test servers can run at once on a host: id i has bridge rfyt<i> and subnet
// 10.(220+i/100).(i%100+1).0/24.
const serverIDs = 200

// claimID returns a server id that no other test server on this host holds, trying from first on, and the func
// that gives it back. Test binaries of several packages run at once (go test ./...), each numbering its own
// servers: without a host-wide claim two of them could share a bridge and subnet, and each one's restart
// reclaims (or its checks count) the other's veths and addresses. The claim is an flock on a file named for the
// id, which the kernel drops if the test process dies; giving it back removes the file.
func claimID(first int) (int, func(), error) {
	dir := filepath.Join(os.TempDir(), "ramify-testserver-ids")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return 0, nil, err
	}
	for k := 0; k < serverIDs; k++ {
		id := (first + k) % serverIDs
		path := filepath.Join(dir, strconv.Itoa(id))
		f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o600)
		if err != nil {
			return 0, nil, err
		}
		if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil || !samePath(f, path) {
			// Held; or given back (removed) between the open and the lock, so that another claim may hold
			// a new file of that name: try the next.
			f.Close()
			continue
		}
		return id, func() { os.Remove(path); f.Close() }, nil
	}
	return 0, nil, fmt.Errorf("all %d test server ids (bridges rfyt*) are held by running tests", serverIDs)
}

// samePath reports whether path still names the file f has open.
func samePath(f *os.File, path string) bool {
	a, err1 := f.Stat()
	b, err2 := os.Stat(path)
	return err1 == nil && err2 == nil && os.SameFile(a, b)
}

var seq atomic.Int32

// Binary returns the ramify binary under test, or skips.
func Binary(t testing.TB) string {
	if os.Geteuid() != 0 {
		t.Skip("needs root: the server creates namespaces, cgroups, mounts and network devices")
	}
	bin := os.Getenv("RAMIFY_TEST_BINARY")
	if bin == "" {
		t.Skip("RAMIFY_TEST_BINARY is not set: run through 'make test' (it builds bin/ramify and the image)")
	}
	return bin
}

// Start starts a server; it is stopped, and every sandbox it still has destroyed, when the test ends.
func Start(t testing.TB, extraArgs ...string) *Server { return StartInheriting(t, nil, extraArgs...) }

// StartInheriting is Start with files left open in the server from descriptor 3 on, not close-on-exec, as a
// careless launcher would leave them.
func StartInheriting(t testing.TB, files []*os.File, extraArgs ...string) *Server {
	return start(t, Binary(t), files, extraArgs)
}

// StartBinary is Start with another server binary than RAMIFY_TEST_BINARY (a benchmark's baseline build, say).
func StartBinary(t testing.TB, bin string, extraArgs ...string) *Server {
	Binary(t) // the same preconditions
	return start(t, bin, nil, extraArgs)
}

func start(t testing.TB, bin string, files []*os.File, extraArgs []string) *Server {
	images := os.Getenv("RAMIFY_TEST_IMAGE_DIR")
	if images == "" {
		images = "/var/cache/ramify/images"
	}
	if _, err := os.Stat(filepath.Join(images, "default", "manifest.json")); err != nil {
		t.Skipf("no test image in %s: run 'make image'", images)
	}
	n := int(seq.Add(1))
	id, release, err := claimID((os.Getpid()*7 + n) % serverIDs)
	if err != nil {
		t.Fatalf("test server: %v", err)
	}
	s := &Server{
		t:       t,
		bin:     bin,
		Key:     fmt.Sprintf("test-key-%d-%d", os.Getpid(), n),
		DataDir: t.TempDir(),
		bridge:  fmt.Sprintf("rfyt%d", id),
		extra:   files,
		release: release,
	}
	s.args = append([]string{"serve", "--listen", "127.0.0.1:0", "--data-dir", s.DataDir, "--image-dir", images,
		"--api-key", s.Key, "--bridge", s.bridge, "--subnet", fmt.Sprintf("10.%d.%d.0/24", 220+id/100, id%100+1),
		"--log-level", "info"}, extraArgs...)
	if rb := os.Getenv("RAMIFY_TEST_RUNTIME_BINARY"); rb != "" {
		// The server under test is not static (a -race build): the family init and agents run this one.
		s.args = append(s.args, "--runtime-binary", rb)
	}
	s.start()
	t.Cleanup(s.cleanup)
	return s
}

func (s *Server) start() { s.startMayExit(false) }

// startMayExit starts the server; when mayExit, a server that exits before it is ready (a crash point on the
// start-up path) is not a failure: s.cmd is then nil.
func (s *Server) startMayExit(mayExit bool) {
	t := s.t
	ready := filepath.Join(s.DataDir, "ready")
	os.Remove(ready)
	logf, err := os.OpenFile(filepath.Join(s.DataDir, "server.log"), os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	s.logf = logf
	cmd := exec.Command(s.bin, s.args...)
	cmd.Stdout, cmd.Stderr = logf, logf
	// No family started ahead unless a test asks (TestPrestartedFamilies, with the flag, which wins): the tests
	// that count a server's family inits and cgroups count those of its sandboxes. In the environment, not a
	// flag, so that a baseline build older than the option still starts (BenchmarkHardeningCost).
	cmd.Env = append(append(os.Environ(), "RAMIFY_READY_FILE="+ready, "RAMIFY_PRESTART_FAMILIES=0"), s.env...)
	cmd.ExtraFiles = s.extra
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	s.cmd = cmd
	exited := make(chan struct{})
	s.exited = exited
	go func() { cmd.Wait(); close(exited) }()
	deadline := time.Now().Add(60 * time.Second)
	for {
		if b, err := os.ReadFile(ready); err == nil && len(b) > 0 {
			s.URL = strings.TrimSpace(string(b))
			break
		}
		select {
		case <-exited:
			if mayExit {
				s.cmd = nil
				logf.Close()
				return
			}
			t.Fatalf("server exited at start:\n%s", s.Log())
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("server did not start within 60s:\n%s", s.Log())
		}
		time.Sleep(20 * time.Millisecond)
	}
	s.Client = client.New(s.URL, s.Key)
}

// PostJSON posts body as JSON to path and decodes the JSON response into out.
func (s *Server) PostJSON(ctx context.Context, path string, body, out any) error {
	b, err := json.Marshal(body)
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, s.URL+path, bytes.NewReader(b))
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+s.Key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	rb, _ := io.ReadAll(resp.Body)
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("POST %s: %d %s", path, resp.StatusCode, rb)
	}
	return json.Unmarshal(rb, out)
}

// Log returns the server's output so far.
func (s *Server) Log() string {
	b, _ := os.ReadFile(filepath.Join(s.DataDir, "server.log"))
	return string(b)
}

// Pid is the server's process id (0 when stopped).
func (s *Server) Pid() int {
	if s.cmd == nil {
		return 0
	}
	return s.cmd.Process.Pid
}

// PeakRSSMiB returns the server process's peak resident memory (VmHWM) in MiB.
func (s *Server) PeakRSSMiB() int {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", s.Pid()))
	if err != nil {
		return -1
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmHWM:" {
			var kb int
			fmt.Sscan(f[1], &kb)
			return kb / 1024
		}
	}
	return -1
}

// Stop stops the server with SIGTERM (sandboxes keep running, as in production).
func (s *Server) Stop() {
	if s.cmd == nil {
		return
	}
	s.cmd.Process.Signal(os.Interrupt)
	done := make(chan struct{})
	go func() { s.cmd.Process.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		s.cmd.Process.Kill()
	}
	s.cmd = nil
	s.logf.Close()
}

// Kill stops the server with SIGKILL, as a crash would.
func (s *Server) Kill() {
	if s.cmd == nil {
		return
	}
	s.cmd.Process.Kill()
	s.cmd.Process.Wait()
	s.cmd = nil
	s.logf.Close()
}

// Restart starts the server again on the same data directory (a new port).
func (s *Server) Restart() {
	s.Stop()
	s.env = nil
	s.start()
}

// RestartCrashingAt restarts the server (stopping it first) with RAMIFY_TEST_CRASH_AT=point: it kills itself
// with SIGKILL when it reaches that point of an operation (see internal/crashpoint). A point on the start-up
// path (a warm-pool fill) may kill it before it is ready; WaitCrash then returns at once.
func (s *Server) RestartCrashingAt(point string) {
	s.Stop()
	s.env = []string{"RAMIFY_TEST_CRASH_AT=" + point}
	s.startMayExit(true)
}

// WaitCrash waits (up to d) for a server started by RestartCrashingAt to kill itself, and fails the test if it
// does not.
func (s *Server) WaitCrash(d time.Duration) {
	s.t.Helper()
	if s.cmd == nil {
		return
	}
	select {
	case <-s.exited:
	case <-time.After(d):
		s.t.Fatalf("the server did not reach its crash point within %s:\n%s", d, tail(s.Log(), 40))
	}
	s.cmd = nil
	s.logf.Close()
}

func (s *Server) cleanup() {
	s.env = nil
	if s.cmd == nil && s.Client != nil {
		// Stopped or killed by the test: start it again so that it destroys what it still has.
		s.start()
	}
	if s.cmd != nil && s.Client != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		if list, err := s.Client.List(ctx, client.ListOptions{}); err == nil {
			for _, sb := range list {
				s.Client.Delete(ctx, sb.ID)
			}
		}
	}
	if s.t.Failed() {
		s.t.Logf("server log:\n%s", tail(s.Log(), 80))
		if b, err := os.ReadFile(filepath.Join(s.DataDir, "logs", "sandboxes.log")); err == nil && len(b) > 0 {
			s.t.Logf("sandboxes.log:\n%s", tail(string(b), 40))
		}
	}
	s.Stop()
	// The layers' loop-mounted btrfs (if any) and the bridge belong to this server only.
	exec.Command("umount", filepath.Join(s.DataDir, "layers", "layers")).Run()
	exec.Command("ip", "link", "del", s.bridge).Run()
	// The server's nftables tables (ip and bridge families), which a server leaves for its next start.
	if c, err := nftables.New(); err == nil {
		for _, fam := range []nftables.TableFamily{nftables.TableFamilyIPv4, nftables.TableFamilyBridge} {
			tb := &nftables.Table{Name: "ramify_" + s.bridge, Family: fam}
			c.AddTable(tb)
			c.DelTable(tb)
		}
		c.Flush() //nolint:errcheck // best effort
	}
	// The server's cgroup parent: ramify/<first 4 bytes of sha256(data dir)> in every hierarchy. A server
	// stopped as it started a warm sandbox leaves that sandbox running (a restart of the server would destroy it,
	// but this data directory is never used again): kill what is left, so that tests leave nothing behind.
	sum := sha256.Sum256([]byte(s.DataDir))
	dirs, _ := filepath.Glob("/sys/fs/cgroup/*/ramify/" + hex.EncodeToString(sum[:4]))
	more, _ := filepath.Glob("/sys/fs/cgroup/ramify/" + hex.EncodeToString(sum[:4]))
	dirs = append(dirs, more...)
	killCgroups(dirs)
	for _, d := range dirs {
		// Sandboxes' (sbx_*), families' (fam_*) and spares' (fam_*.s*) cgroups.
		subs, _ := filepath.Glob(filepath.Join(d, "*", "cgroup.procs"))
		for _, sub := range subs {
			os.Remove(filepath.Dir(sub))
		}
		os.Remove(d)
	}
	if s.release != nil {
		s.release()
		s.release = nil
	}
}

// killCgroups SIGKILLs every process in the cgroups below dirs and waits (up to 5 s) for them to go.
func killCgroups(dirs []string) {
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		left := 0
		for _, d := range dirs {
			procs, _ := filepath.Glob(filepath.Join(d, "*", "cgroup.procs"))
			for _, f := range procs {
				b, _ := os.ReadFile(f)
				for _, p := range strings.Fields(string(b)) {
					if pid, _ := strconv.Atoi(p); pid > 0 {
						syscall.Kill(pid, syscall.SIGKILL)
						left++
					}
				}
			}
		}
		if left == 0 {
			return
		}
	}
}

func tail(s string, n int) string {
	lines := strings.Split(s, "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
