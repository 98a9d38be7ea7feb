package integration

import (
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ramify-dev/ramify/client"
	"github.com/ramify-dev/ramify/internal/testserver"
)

// TestPrestartedFamilies: with --prestart-families 1 a cold create (and a resume) runs in a family the server
// started ahead, whose spare agent takes the sandbox: it has its own hostname, runs code and commands, forks,
// pauses and resumes into another such family; the pool is refilled; a killed server's family started ahead is
// ended by the next start; nothing of it is left once the server stops and the sandboxes are gone.
func TestPrestartedFamilies(t *testing.T) {
	s := testserver.Start(t, "--warm-pool", "0", "--prestart-families", "1", "--fork-ahead", "0")
	ctx := ctxT(t)
	waitInits := func(want int, why string) {
		t.Helper()
		deadline := time.Now().Add(20 * time.Second)
		for len(s.Inventory().Inits) != want {
			if time.Now().After(deadline) {
				t.Fatalf("%s: %d family inits, want %d\n%s", why, len(s.Inventory().Inits), want, s.Log())
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	// A taken family started ahead is replaced 250 ms after it was taken.
	waitReady := func(why string) { t.Helper(); waitFamiliesReady(t, s, "fam_p", "", 1, 20*time.Second, why) }
	waitReady("at start")
	waitInits(1, "a family started ahead")

	id := create(t, s, &client.CreateRequest{Env: map[string]string{"WHO": "prestarted"}})
	info, err := s.Client.Get(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(info.FamilyID, "fam_p") {
		t.Fatalf("family %q: the create did not take the family started ahead", info.FamilyID)
	}
	if v := value(t, s, id, "import os, socket; x = 41; (x + 1, os.environ['WHO'], socket.gethostname())"); v != "(42, 'prestarted', '"+info.Hostname+"')" {
		t.Fatalf("in the sandbox: %s (hostname %s)", v, info.Hostname)
	}
	if r := sh(t, s, id, "cat /etc/hostname; echo $WHO"); r.Stdout != info.Hostname+"\nprestarted\n" {
		t.Fatalf("exec: %q", r.Stdout)
	}
	// Its interpreter was forked from the family's zygote: it is as a fresh one, with the sandbox's env, cwd,
	// thread pools and its own fd-level output, and the zygote is gone.
	// (fd-level output and print()'s come by different paths: their order is not kept)
	if ex := run(t, s, id, "import sys; os.system('echo fd-out'); print(os.getcwd(), os.environ['OMP_NUM_THREADS'], 'dill' in sys.modules)"); sortedLines(ex.Stdout) != "/root 1 False\nfd-out" || ex.ExecutionCount != 2 {
		t.Fatalf("the interpreter of a sandbox in a family started ahead: %+v", ex)
	}
	noZygote := func(why, family string) {
		t.Helper()
		zyg := "zyg_" + strings.TrimPrefix(family, "fam_")
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(50 * time.Millisecond) {
			inv := s.Inventory()
			if !slices.Contains(inv.Cgroups, zyg) && !slices.Contains(inv.Layers, zyg) {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: zygote %s left: %+v", why, zyg, inv)
			}
		}
	}
	noZygote("after the create", info.FamilyID)
	// An env Python reads as it starts gets an interpreter started with it.
	waitReady("before a create with PYTHONPATH")
	pp := create(t, s, &client.CreateRequest{Env: map[string]string{"PYTHONPATH": "/opt/extra"}})
	if v := value(t, s, pp, "import sys; '/opt/extra' in sys.path"); v != "True" {
		t.Fatalf("PYTHONPATH given at create is not in sys.path: %s", v)
	}
	if err := s.Client.Delete(ctx, pp); err != nil {
		t.Fatal(err)
	}
	// The pool is refilled: this sandbox's family and a new one started ahead.
	waitInits(2, "the pool refilled")

	kids, err := s.Client.Fork(ctx, id, 2)
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range kids {
		if v := value(t, s, k, "x"); v != "41" {
			t.Fatalf("fork child %s: x = %s", k, v)
		}
		if err := s.Client.Delete(ctx, k); err != nil {
			t.Fatal(err)
		}
	}

	pauseAndWait(t, s, id)
	resumeAndWait(t, s, id)
	rinfo, err := s.Client.Get(ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(rinfo.FamilyID, "fam_p") || rinfo.FamilyID == info.FamilyID {
		t.Fatalf("resumed into family %q (was %q): want another family started ahead", rinfo.FamilyID, info.FamilyID)
	}
	if v := value(t, s, id, "x"); v != "41" {
		t.Fatalf("after resume: x = %s", v)
	}
	noZygote("after the resume", rinfo.FamilyID)
	if err := s.Client.Delete(ctx, id); err != nil {
		t.Fatal(err)
	}
	waitInits(1, "only the family started ahead left")
	waitReady("before the kill")
	// A server killed outright leaves its family started ahead behind; the next start's reclaim scan ends it and
	// starts a new one.
	orphan := s.Inventory().Inits[0]
	s.Kill()
	s.Restart()
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		if inits := s.Inventory().Inits; len(inits) == 1 && inits[0] != orphan {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("after the restart: %+v (the dead server's family started ahead was %d)\n%s", s.Inventory(), orphan, s.Log())
		}
	}
	s.Stop()
	inv := s.Inventory()
	if len(inv.Inits) != 0 || len(inv.Cgroups) != 0 || len(inv.Veths) != 0 || len(inv.Layers) != 0 {
		t.Fatalf("left after the server stopped: %+v", inv)
	}
}

// A warm sandbox made in a family started ahead has its zygote's interpreter; claimed by a create, it takes the
// create's env and cwd as any warm sandbox does, its time zone (TZ) included (and an env Python reads at start
// gets a fresh interpreter).
func TestWarmSandboxFromAZygoteTakesTheCreatesEnv(t *testing.T) {
	s := testserver.Start(t, "--warm-pool", "1", "--prestart-families", "1", "--fork-ahead", "0")
	ctx := ctxT(t)
	// The pool's first warm sandbox takes the family started ahead; wait until it is ready.
	warm := func() bool {
		return slices.ContainsFunc(s.Inventory().Layers, func(l string) bool { return strings.HasPrefix(l, "sbx_") })
	}
	for deadline := time.Now().Add(20 * time.Second); !warm(); time.Sleep(50 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no warm sandbox: %+v\n%s", s.Inventory(), s.Log())
		}
	}
	time.Sleep(500 * time.Millisecond)
	fromZygote := 0
	for i, env := range []map[string]string{{"WHO": "claimed", "TZ": "Asia/Tokyo"}, {"WHO": "claimed", "PYTHONPATH": "/opt/extra"}} {
		id := create(t, s, &client.CreateRequest{Env: env, Cwd: "/tmp"})
		info, err := s.Client.Get(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		want := "('claimed', '/tmp', False, 'JST')" // the time zone as a fresh interpreter reads it from TZ
		if i == 1 {
			want = "('claimed', '/tmp', True, 'UTC')"
		}
		if v := value(t, s, id, "import os, sys, time; (os.environ.get('WHO'), os.getcwd(), '/opt/extra' in sys.path, time.strftime('%Z'))"); v != want {
			t.Fatalf("create %d (family %s): %s, want %s\n%s", i, info.FamilyID, v, want, s.Log())
		}
		if strings.HasPrefix(info.FamilyID, "fam_p") {
			fromZygote++
		}
		if err := s.Client.Delete(ctx, id); err != nil {
			t.Fatal(err)
		}
		time.Sleep(700 * time.Millisecond) // the pool refilled, from a new family started ahead
	}
	if !strings.Contains(s.Log(), "warm=true") || fromZygote == 0 {
		t.Fatalf("no create was served by a warm sandbox made from a zygote (%d)\n%s", fromZygote, s.Log())
	}
}

// TestResumeFromAZygoteThatImportedNumpy: a pause whose session holds numpy arrays makes the server keep a
// family whose zygote imported numpy ahead (fam_n...); the resume takes it and its interpreter is that
// zygote's fork, with the session's state and numpy as a fresh import would give it. A resume that would import
// numpy otherwise gets a fresh interpreter: a sandbox of 2 vCPUs (other thread counts) is not given that family,
// and one whose cwd holds its own numpy package (which a fresh import finds first) is, but starts afresh.
func TestResumeFromAZygoteThatImportedNumpy(t *testing.T) {
	s := testserver.Start(t, "--warm-pool", "0", "--prestart-families", "1", "--fork-ahead", "0")
	ctx := ctxT(t)
	// forkedInterpreter reports whether sandbox id's interpreter was forked (from a zygote) rather than started
	// by its agent: its parent is not the agent.
	forkedInterpreter := func(id string) bool {
		t.Helper()
		agentPid := testserver.AgentPid(id)
		for _, pid := range testserver.SandboxPids(id) {
			if cmd, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid)); strings.HasPrefix(string(cmd), "python3") {
				st, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
				if err != nil {
					t.Fatal(err)
				}
				f := strings.Fields(string(st[strings.LastIndexByte(string(st), ')')+2:]))
				return f[1] != strconv.Itoa(agentPid)
			}
		}
		t.Fatalf("%s: no interpreter", id)
		return false
	}
	// resumeUntil pauses and resumes id until it lands in a family whose id starts with prefix.
	resumeUntil := func(id, prefix string) *client.Sandbox {
		t.Helper()
		for deadline := time.Now().Add(30 * time.Second); ; time.Sleep(500 * time.Millisecond) {
			pauseAndWait(t, s, id)
			resumeAndWait(t, s, id)
			info, err := s.Client.Get(ctx, id)
			if err != nil {
				t.Fatal(err)
			}
			if strings.HasPrefix(info.FamilyID, prefix) {
				return info
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s never resumed into a %s family (last %s)\n%s", id, prefix, info.FamilyID, s.Log())
			}
		}
	}
	id := create(t, s, &client.CreateRequest{MemMiB: 1024})
	value(t, s, id, "import numpy as np\na = np.arange(10)\nn = 0")
	// The pause saved a session that needs numpy: the server starts such a family at once, so the first resume
	// finds it once it is ready (its spare placed, the last step).
	pauseAndWait(t, s, id)
	waitFamiliesReady(t, s, "fam_n", "", 1, 20*time.Second, "a family with numpy imported ahead after the pause")
	resumeAndWait(t, s, id)
	if info, err := s.Client.Get(ctx, id); err != nil || !strings.HasPrefix(info.FamilyID, "fam_n") {
		t.Fatalf("the first resume went to %+v (%v), want the family with numpy imported ahead", info, err)
	}
	if !forkedInterpreter(id) {
		t.Fatalf("resumed into a family with numpy imported ahead, but its interpreter was started afresh\n%s", s.Log())
	}
	if v := value(t, s, id, "import os; n += 1; (int(a.sum()), np.__file__, os.environ.get('OPENBLAS_NUM_THREADS'), 0 <= np.random.rand() < 1, float(np.ones(3) @ np.ones(3)), n)"); v != "(45, '/usr/lib/python3/dist-packages/numpy/__init__.py', '1', True, 3.0, 1)" {
		t.Fatalf("after a resume from the zygote: %s", v)
	}
	// Two resumes at once find the one family kept with numpy imported ahead: one of them imports numpy itself (a
	// miss), and the server then keeps two such families, so that two resumes in a row both find one.
	other := create(t, s, &client.CreateRequest{MemMiB: 1024})
	value(t, s, other, "import numpy as np\nb = np.arange(4)\n1")
	pauseAndWait(t, s, id)
	pauseAndWait(t, s, other)
	waitFamiliesReady(t, s, "fam_n", "", 1, 30*time.Second, "a family with numpy imported ahead after the resume that took one")
	both := []string{id, other}
	errs := make([]error, len(both))
	var wg sync.WaitGroup
	for i, sb := range both {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, _, errs[i] = s.Client.Resume(ctx, sb)
		}()
	}
	wg.Wait()
	served := 0
	for i, sb := range both {
		if errs[i] != nil {
			t.Fatalf("resume %s: %v", sb, errs[i])
		}
		if _, err := s.Client.WaitStatus(ctx, sb, "running"); err != nil {
			t.Fatalf("wait running %s: %v", sb, err)
		}
		info, err := s.Client.Get(ctx, sb)
		if err != nil {
			t.Fatal(err)
		}
		if strings.HasPrefix(info.FamilyID, "fam_n") {
			served++
		}
	}
	if served == 2 {
		t.Fatalf("two resumes at once both found a family with numpy imported ahead, where one was kept")
	}
	if v := value(t, s, other, "int(b.sum())"); v != "6" {
		t.Fatalf("after a resume at once with another: %s", v)
	}
	if err := s.Client.Delete(ctx, other); err != nil {
		t.Fatal(err)
	}
	// Two such families ready, two resumes in a row; a resume slowed down enough by a loaded host may find the second not replaced yet,
	// so the pair gets three tries (with one family kept, none can ever succeed: the wait for two fails).
	for try := 1; ; try++ {
		info, err := s.Client.Get(ctx, id)
		if err != nil {
			t.Fatal(err)
		}
		waitFamiliesReady(t, s, "fam_n", info.FamilyID, 2, 30*time.Second,
			"after a resume found none ready, the server keeps two families with numpy imported ahead")
		var went []string
		for range 2 {
			pauseAndWait(t, s, id)
			resumeAndWait(t, s, id)
			info, err := s.Client.Get(ctx, id)
			if err != nil {
				t.Fatal(err)
			}
			went = append(went, info.FamilyID)
		}
		if strings.HasPrefix(went[0], "fam_n") && strings.HasPrefix(went[1], "fam_n") {
			break
		}
		if try == 3 {
			t.Fatalf("two resumes in a row went to %v, want two families with numpy imported ahead\n%s", went, s.Log())
		}
	}
	if v := value(t, s, id, "n += 1; (int(a.sum()), n)"); v != "(45, 2)" {
		t.Fatalf("after resumes in a row: %s", v)
	}

	// A session without numpy takes a plain family started ahead.
	plain := create(t, s, nil)
	value(t, s, plain, "x = 41")
	if info := resumeUntil(plain, "fam_p"); value(t, s, plain, "x") != "41" {
		t.Fatalf("plain session after resume into %s: x is not 41", info.FamilyID)
	}

	// 2 vCPUs: the zygote's thread counts are a 1-vCPU sandbox's.
	two := create(t, s, &client.CreateRequest{MemMiB: 1024, VCPU: 2})
	value(t, s, two, "import numpy as np\na = np.arange(4)\n1")
	pauseAndWait(t, s, two)
	resumeAndWait(t, s, two)
	info, err := s.Client.Get(ctx, two)
	if err != nil {
		t.Fatal(err)
	}
	if strings.HasPrefix(info.FamilyID, "fam_n") {
		t.Fatalf("a 2-vCPU sandbox resumed into %s, a family whose numpy was imported for 1 vCPU", info.FamilyID)
	}
	if v := value(t, s, two, "import os; (int(a.sum()), os.environ.get('OPENBLAS_NUM_THREADS'))"); v != "(6, '2')" {
		t.Fatalf("2-vCPU sandbox after resume: %s", v)
	}

	// A numpy package of the sandbox's own in its cwd: a fresh import finds it first, so the resume must too.
	own := create(t, s, &client.CreateRequest{MemMiB: 1024})
	value(t, s, own, "import numpy as np\na = np.arange(3)\n1")
	sh(t, s, own, "mkdir -p /root/numpy && echo 'OWN = True' > /root/numpy/__init__.py")
	resumeUntil(own, "fam_n")
	if forkedInterpreter(own) {
		t.Fatal("a sandbox with its own numpy in its cwd kept the zygote's interpreter, which imported another numpy")
	}
	if v := value(t, s, own, "import numpy; (numpy.__file__, getattr(numpy, 'OWN', False))"); v != "('/root/numpy/__init__.py', True)" {
		t.Fatalf("with its own numpy: %s", v)
	}
	// One in the standard library's directory, before dist-packages on sys.path: the host sees it in the layer,
	// and the resume gets no interpreter that imported numpy ahead.
	shadow := create(t, s, &client.CreateRequest{MemMiB: 1024})
	value(t, s, shadow, "import numpy as np\na = np.arange(3)\n1")
	sh(t, s, shadow, "d=$(python3 -c 'import sysconfig; print(sysconfig.get_path(\"stdlib\"))') && mkdir -p $d/numpy && echo 'OWN = True' > $d/numpy/__init__.py")
	pauseAndWait(t, s, shadow)
	resumeAndWait(t, s, shadow)
	if v := value(t, s, shadow, "import numpy; (numpy.__file__, getattr(numpy, 'OWN', False))"); v != "('/usr/lib/python3.11/numpy/__init__.py', True)" {
		t.Fatalf("with its own numpy in the standard library's directory: %s", v)
	}
	for _, sb := range []string{id, plain, two, own, shadow} {
		if err := s.Client.Delete(ctx, sb); err != nil {
			t.Fatal(err)
		}
	}
	s.Stop()
	if inv := s.Inventory(); len(inv.Inits) != 0 || len(inv.Cgroups) != 0 || len(inv.Layers) != 0 {
		t.Fatalf("left after the server stopped: %+v", inv)
	}
}

// TestResumeRunsTheSandboxsStartupFiles: a sandbox whose own files change an interpreter's start (a .pth file
// that adds a directory to sys.path, as editable installs and namespace packages have; a user site directory,
// on sys.path only if it exists as Python starts) resumes into an interpreter started with them, not a
// zygote's, which started without them.
func TestResumeRunsTheSandboxsStartupFiles(t *testing.T) {
	s := testserver.Start(t, "--warm-pool", "0", "--prestart-families", "1", "--fork-ahead", "0")
	for _, c := range []struct{ name, setup, check, want string }{
		{".pth", "d=$(python3 -c 'import sysconfig; print(sysconfig.get_path(\"purelib\"))') && mkdir -p $d /opt/extra && " +
			"echo /opt/extra > $d/extra.pth && echo 'X = 5' > /opt/extra/extramod.py",
			"import sys, extramod; ('/opt/extra' in sys.path, extramod.X)", "(True, 5)"},
		{"user site", "u=$(python3 -m site --user-site) && mkdir -p $u && echo 'Y = 6' > $u/usermod.py",
			"import site, sys, usermod; (site.getusersitepackages() in sys.path, usermod.Y)", "(True, 6)"},
	} {
		id := create(t, s, nil)
		sh(t, s, id, c.setup)
		pauseAndWait(t, s, id)
		resumeAndWait(t, s, id)
		if v := value(t, s, id, c.check); v != c.want {
			t.Fatalf("%s: after the resume: %s, want %s", c.name, v, c.want)
		}
	}
}

// TestResumeAfterARestartFindsNumpyImportedAhead: a family with numpy imported ahead is kept for a paused session
// that needs it for as long as it stays paused, not only in the minutes after its pause: after a restart, which
// forgets those minutes, the server makes one at once and the resume takes it.
func TestResumeAfterARestartFindsNumpyImportedAhead(t *testing.T) {
	s := testserver.Start(t, "--warm-pool", "0", "--prestart-families", "1", "--fork-ahead", "0")
	ctx := ctxT(t)
	id := create(t, s, &client.CreateRequest{MemMiB: 1024})
	value(t, s, id, "import numpy as np\na = np.arange(10)\n1")
	pauseAndWait(t, s, id)
	s.Restart()
	waitFamiliesReady(t, s, "fam_n", "", 1, 30*time.Second, "a family with numpy imported ahead, after a restart, for the paused sandbox")
	resumeAndWait(t, s, id)
	if info, err := s.Client.Get(ctx, id); err != nil || !strings.HasPrefix(info.FamilyID, "fam_n") {
		t.Fatalf("the resume after a restart went to %+v (%v), want the family with numpy imported ahead", info, err)
	}
	if v := value(t, s, id, "int(a.sum())"); v != "45" {
		t.Fatalf("after the resume: %s", v)
	}
}

// waitFamiliesReady waits (up to within) until n families started ahead whose ids start with prefix, other than
// family except (a running sandbox's, whose spares are its own), are ready: a family is ready once its spare
// sits in a cgroup of its own (<family>.s<pid>), the last step of starting it, and is added to the pool just
// after, hence 400 ms more. Each serves one create or resume.
func waitFamiliesReady(t *testing.T, s *testserver.Server, prefix, except string, n int, within time.Duration, what string) {
	t.Helper()
	ready := func() int {
		fams := map[string]bool{}
		for _, c := range s.Inventory().Cgroups {
			if fam, _, ok := strings.Cut(c, ".s"); ok && strings.HasPrefix(c, prefix) && fam != except {
				fams[fam] = true
			}
		}
		return len(fams)
	}
	waitUntil(t, within, func() bool { return ready() >= n }, func() string {
		return fmt.Sprintf("%s: %d of %d ready: %+v\n%s", what, ready(), n, s.Inventory(), s.Log())
	})
	time.Sleep(400 * time.Millisecond)
}
