// Package s3test starts a real S3-compatible server for tests and benchmarks: versitygw with its posix backend,
// built from the Go module proxy on first use into a cache directory outside ramify's module (so go.mod stays free
// of it), reused afterwards, and run on loopback for the life of the test binary. Nothing is mocked.
package s3test

import (
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"sync"
	"syscall"
	"testing"
	"time"
)

// RAMIFY_TOOLS_DIR overrides the cache directory (default /var/cache/ramify/tools, else the user cache
// directory). RAMIFY_REQUIRE_S3=1 turns "cannot build the server" from a skip into a failure.

const versitygwVersion = "v1.8.0"

var s3srv struct {
	once     sync.Once
	err      error
	endpoint string
	proc     *os.Process
	exited   chan error
	dataDir  string
	buildDur time.Duration
	cached   bool
}

// The credentials the test server accepts.
const (
	AccessKey = "ramifytestaccess"
	SecretKey = "ramifytestsecret0123456789"
)

// Stop stops the server if it was started; call it from TestMain after m.Run.
func Stop() {
	if s3srv.proc != nil {
		_ = s3srv.proc.Kill()
		<-s3srv.exited
	}
	if s3srv.dataDir != "" {
		_ = os.RemoveAll(s3srv.dataDir)
		_ = os.Remove(s3srv.dataDir + ".log")
	}
}

func toolsDir() string {
	if d := os.Getenv("RAMIFY_TOOLS_DIR"); d != "" {
		return d
	}
	d := "/var/cache/ramify/tools"
	if err := os.MkdirAll(d, 0o755); err == nil && syscall.Access(d, 2 /* W_OK */) == nil {
		return d
	}
	c, err := os.UserCacheDir()
	if err != nil {
		c = os.TempDir()
	}
	return filepath.Join(c, "ramify", "tools")
}

// versitygwBinary returns the cached versitygw binary, building it first if needed.
func versitygwBinary() (bin string, built bool, err error) {
	dir := filepath.Join(toolsDir(), "versitygw-"+versitygwVersion)
	bin = filepath.Join(dir, "versitygw")
	if _, err := os.Stat(bin); err == nil {
		return bin, false, nil
	}
	if err := os.MkdirAll(filepath.Dir(dir), 0o755); err != nil {
		return "", false, err
	}
	// One build at a time across processes.
	lock, err := os.OpenFile(dir+".lock", os.O_CREATE|os.O_RDWR, 0o644)
	if err != nil {
		return "", false, err
	}
	defer lock.Close()
	if err := syscall.Flock(int(lock.Fd()), syscall.LOCK_EX); err != nil {
		return "", false, err
	}
	if _, err := os.Stat(bin); err == nil {
		return bin, false, nil
	}
	gobin, err := os.MkdirTemp(filepath.Dir(dir), ".build-")
	if err != nil {
		return "", false, err
	}
	defer os.RemoveAll(gobin)
	goCmd, err := exec.LookPath("go")
	if err != nil {
		goCmd = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	cmd := exec.Command(goCmd, "install", "github.com/versity/versitygw/cmd/versitygw@"+versitygwVersion)
	cmd.Dir = os.TempDir() // outside ramify's module
	cmd.Env = append(os.Environ(), "GOFLAGS=-mod=mod", "GOBIN="+gobin, "CGO_ENABLED=0")
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", false, fmt.Errorf("go install versitygw@%s: %v\n%s", versitygwVersion, err, out)
	}
	if err := os.Rename(gobin, dir); err != nil {
		return "", false, err
	}
	return bin, true, nil
}

func freePort() (int, error) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, err
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port, nil
}

func startS3Server() error {
	start := time.Now()
	bin, built, err := versitygwBinary()
	if err != nil {
		return err
	}
	s3srv.buildDur, s3srv.cached = time.Since(start), !built
	if s3srv.dataDir, err = os.MkdirTemp("", "ramify-versitygw-"); err != nil {
		return err
	}
	var lastErr error
	for attempt := 0; attempt < 3; attempt++ {
		port, err := freePort()
		if err != nil {
			return err
		}
		addr := "127.0.0.1:" + strconv.Itoa(port)
		logf, err := os.Create(s3srv.dataDir + ".log")
		if err != nil {
			return err
		}
		cmd := exec.Command(bin, "--access", AccessKey, "--secret", SecretKey, "--port", addr, "--quiet",
			"posix", s3srv.dataDir)
		cmd.Stdout, cmd.Stderr = logf, logf
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		if err := cmd.Start(); err != nil {
			logf.Close()
			return err
		}
		logf.Close()
		exited := make(chan error, 1)
		go func() { exited <- cmd.Wait() }()
		deadline := time.Now().Add(20 * time.Second)
		for {
			c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond)
			if err == nil {
				c.Close()
				s3srv.proc, s3srv.exited, s3srv.endpoint = cmd.Process, exited, addr
				return nil
			}
			select {
			case err := <-exited:
				lastErr = fmt.Errorf("versitygw exited: %v (log %s.log)", err, s3srv.dataDir)
			case <-time.After(50 * time.Millisecond):
				if time.Now().Before(deadline) {
					continue
				}
				_ = cmd.Process.Kill()
				<-exited
				lastErr = fmt.Errorf("versitygw did not listen on %s within 20s", addr)
			}
			break
		}
	}
	return lastErr
}

// Endpoint returns the loopback host:port of the test server, starting it on first use, or skips t (loudly)
// if the server cannot be built; with RAMIFY_REQUIRE_S3=1 that is a failure instead.
func Endpoint(t testing.TB) string {
	t.Helper()
	s3srv.once.Do(func() {
		s3srv.err = startS3Server()
		if s3srv.err == nil {
			how := "built"
			if s3srv.cached {
				how = "cached binary"
			}
			fmt.Fprintf(os.Stderr, "s3test: versitygw %s on %s (%s, ready in %v)\n",
				versitygwVersion, s3srv.endpoint, how, s3srv.buildDur.Round(time.Millisecond))
		}
	})
	if s3srv.err != nil {
		msg := fmt.Sprintf("!!! S3 TESTS NOT RUN: cannot build or start versitygw %s: %v", versitygwVersion, s3srv.err)
		if os.Getenv("RAMIFY_REQUIRE_S3") == "1" {
			t.Fatal(msg)
		}
		fmt.Fprintln(os.Stderr, msg)
		t.Skip(msg)
	}
	return s3srv.endpoint
}
