package namespaces

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	osexec "os/exec"

	"github.com/google/nftables"

	"github.com/ramify-dev/ramify/internal/agent"
	"github.com/ramify-dev/ramify/internal/cgroups"
	"github.com/ramify-dev/ramify/internal/image"
	"github.com/ramify-dev/ramify/internal/layer"
	"github.com/ramify-dev/ramify/internal/network"
	"github.com/ramify-dev/ramify/internal/runtime"
)

// testRootfs finds the image to run sandboxes on: RAMIFY_TEST_ROOTFS, or the default image in
// RAMIFY_TEST_IMAGE_DIR (default /var/cache/ramify/images, where `make test` builds it).
func testRootfs(t testing.TB) string {
	if p := os.Getenv("RAMIFY_TEST_ROOTFS"); p != "" {
		return p
	}
	dir := os.Getenv("RAMIFY_TEST_IMAGE_DIR")
	if dir == "" {
		dir = "/var/cache/ramify/images"
	}
	img, err := image.Load(dir)
	if err != nil {
		t.Skipf("no sandbox image (%v): run 'make image' or set RAMIFY_TEST_IMAGE_DIR", err)
	}
	return img.Rootfs
}

func requireRoot(t testing.TB) {
	if os.Geteuid() != 0 {
		t.Skip("needs root: creates namespaces, cgroups, mounts and network devices")
	}
}

type testEnv struct {
	rt  *Runtime
	net *network.Manager
}

var testSeq int

func newTestRuntime(t testing.TB, opts ...func(*Config)) *testEnv {
	requireRoot(t)
	if os.Getenv("RAMIFY_TEST_BINARY") == "" {
		t.Skip("RAMIFY_TEST_BINARY is not set: the family init needs the static bin/ramify (run through 'make test')")
	}
	rootfs := testRootfs(t)
	dir := t.TempDir()
	ctx := context.Background()
	t.Cleanup(func() {
		if t.Failed() {
			b, _ := os.ReadFile(dir + "/logs/sandboxes.log")
			t.Logf("sandboxes.log:\n%s", b)
		}
	})
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	layers, err := layer.Open(ctx, dir+"/layers", layer.Options{Driver: "copy", Logger: log})
	if err != nil {
		t.Fatal(err)
	}
	testSeq++
	// Under a parent of its own: internal/cgroups's tests, which may run meanwhile, remove whatever is under theirs.
	cgParent := fmt.Sprintf("ramifytest-rt/rt%d-%d", os.Getpid(), testSeq)
	cg, err := cgroups.Detect(cgParent, log)
	if err != nil {
		t.Fatal(err)
	}
	// Last (cleanups run in reverse), once the runtime is closed: the manager's frozen keeper (cgroups v1), as a
	// server's stop releases it, then this test's parent and, once no other test's is left, ramifytest-rt. A
	// keeper left behind would keep the parent from being removed.
	t.Cleanup(func() {
		if rl, ok := cg.(cgroups.Releaser); ok {
			if err := rl.Release(); err != nil {
				t.Errorf("release the cgroup manager: %v", err)
			}
		}
		dirs, _ := filepath.Glob("/sys/fs/cgroup/*/" + cgParent)
		for _, d := range append(dirs, "/sys/fs/cgroup/"+cgParent) {
			os.Remove(d)               // empty once the runtime is closed; one still holding a cgroup is left
			os.Remove(filepath.Dir(d)) // ramifytest-rt, if it is empty
		}
	})
	br := fmt.Sprintf("rfyrt%d", os.Getpid()%100000)
	nw, err := network.New(ctx, network.Config{Bridge: br, CIDR: "10.231.0.0/24"}, log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		nw.Close()
		if l, err := net.InterfaceByName(br); err == nil {
			_ = l
			osexec.Command("ip", "link", "del", br).Run()
		}
		// The manager's nftables tables (ip and bridge families), which a server keeps for its next start.
		if c, err := nftables.New(); err == nil {
			for _, fam := range []nftables.TableFamily{nftables.TableFamilyIPv4, nftables.TableFamilyBridge} {
				c.DelTable(&nftables.Table{Name: "ramify_" + br, Family: fam})
				c.Flush() //nolint:errcheck // absent is fine
			}
		}
	})
	// The family init runs the binary from an empty root, so it must be static: make test passes the built
	// bin/ramify; a test binary built with CGO_ENABLED=0 can also play both roles itself (see TestMain). It is
	// copied into a directory only host root can enter, as a checkout under /root is: the runtime must never
	// need the sandbox's uid to reach it by path.
	bin := filepath.Join(dir, "private", "ramify")
	if err := os.MkdirAll(filepath.Dir(bin), 0o700); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(os.Getenv("RAMIFY_TEST_BINARY")); err != nil || os.WriteFile(bin, b, 0o700) != nil {
		t.Fatalf("copy the test binary: %v", err)
	}
	cfg := Config{DataDir: dir, Binary: bin, ImageRootfs: rootfs, Layers: layers, Cgroups: cg, Network: nw, Logger: log}
	for _, o := range opts {
		o(&cfg)
	}
	rt, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	return &testEnv{rt: rt, net: nw}
}

func TestCreateRunDestroy(t *testing.T) {
	env := newTestRuntime(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ip, _ := env.net.Allocate(func(net.IP) bool { return false })
	start := time.Now()
	h, err := env.rt.Create(ctx, runtime.Spec{ID: "sbx_00000000000000000000000000000001", Hostname: "sbx-test", IP: ip,
		VCPU: 1, MemMiB: 256, MaxProcs: 128, Cwd: "/root", Env: map[string]string{"GREETING": "hi"}})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("create took %s", time.Since(start))
	defer env.rt.Destroy(context.Background(), h)
	c, err := env.rt.Agent(h.ID)
	if err != nil {
		t.Fatal(err)
	}
	ev, err := c.RunCode(ctx, agent.RunCodeRequest{Code: "x = 41\nimport os\nprint(os.environ['GREETING'])\nx + 1"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if ev.Value == nil || *ev.Value != "42" || ev.Stdout != "hi\n" || ev.Error != nil {
		t.Fatalf("run_code = %+v (err %+v)", ev, ev.Error)
	}
	ev, err = c.Exec(ctx, agent.ExecRequest{Cmd: "hostname; id -u; cat /proc/1/cmdline | tr '\\0' ' '; ip -4 -o addr show eth0"}, nil)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("exec: %q %q", ev.Stdout, ev.Stderr)
	if !strings.HasPrefix(ev.Stdout, "sbx-test\n0\n") || !strings.Contains(ev.Stdout, ip.String()) {
		t.Fatalf("exec output %q", ev.Stdout)
	}
}

// TestCreateBesideAZygoteItCannotUse: a create that takes a family started ahead but cannot use its zygote (its
// own startup files here, as a resume may bring; a named image likewise) has its agent in the family before the
// zygote ends. A family's init ends once nothing but spares is left in it: a zygote ended first (10 ms after
// the create began, racing its spawn) took the family down under the create now and then. With the zygote ended
// at once, one of the five creates here failed in most runs.
func TestCreateBesideAZygoteItCannotUse(t *testing.T) {
	env := newTestRuntime(t, func(c *Config) { c.PrestartFamilies = 1 })
	t.Cleanup(func() { env.rt.Close() })
	defer func(d time.Duration) { zygoteEndDelay = d }(zygoteEndDelay)
	zygoteEndDelay = 0
	env.rt.startPrestartUpkeep()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	for i := range 5 {
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(20 * time.Millisecond) {
			env.rt.pre.mu.Lock()
			ready := len(env.rt.pre.idle) > 0 && env.rt.pre.idle[0].zyg != nil
			env.rt.pre.mu.Unlock()
			if ready {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("create %d: no family with a zygote started ahead", i)
			}
		}
		ip, _ := env.net.Allocate(func(net.IP) bool { return false })
		h, err := env.rt.Create(ctx, runtime.Spec{ID: fmt.Sprintf("sbx_%032d", i+1), Hostname: "sbx-test", IP: ip,
			VCPU: 1, MemMiB: 256, MaxProcs: 128, Cwd: "/root",
			Populate: func(upper string) error {
				if err := os.MkdirAll(filepath.Join(upper, "etc"), 0o755); err != nil {
					return err
				}
				return os.WriteFile(filepath.Join(upper, "etc", "localtime"), []byte("TZif"), 0o644)
			}})
		if err != nil {
			t.Fatalf("create %d beside a zygote it cannot use: %v", i, err)
		}
		if !strings.HasPrefix(h.FamilyID, "fam_p") {
			t.Fatalf("create %d: family %s, want the family started ahead", i, h.FamilyID)
		}
		c, err := env.rt.Agent(h.ID)
		if err != nil {
			t.Fatal(err)
		}
		if ev, err := c.RunCode(ctx, agent.RunCodeRequest{Code: "1 + 1"}, nil); err != nil || ev.Value == nil || *ev.Value != "2" {
			t.Fatalf("create %d: run_code = %+v, %v", i, ev, err)
		}
		if err := env.rt.Destroy(ctx, h); err != nil {
			t.Fatal(err)
		}
	}
}
