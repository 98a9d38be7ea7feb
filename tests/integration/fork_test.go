package integration

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/ramify-dev/ramify/client"
	"github.com/ramify-dev/ramify/internal/network"
	"github.com/ramify-dev/ramify/internal/testserver"
)

func TestForkChildrenInheritAndDiverge(t *testing.T) {
	s := testserver.Start(t)
	ctx := ctxT(t)
	parent := create(t, s, &client.CreateRequest{Env: map[string]string{"MODE": "parent-env"}, Metadata: map[string]string{"exp": "1"}})
	value(t, s, parent, `import json, numpy as np
x = 42
data = {"k": [1, 2, 3]}
arr = np.arange(1000)
log = open("/root/log.txt", "w+")
log.write("before fork\n"); log.flush()
def helper(v):
    return v * 2
import os
os.environ["MODE"] = "changed-at-runtime"  # interpreter state: children keep it, whatever the sandbox's env says
1`)
	sh(t, s, parent, "mkdir -p /root/proj && echo base > /root/proj/base.txt")

	kids, err := s.Client.Fork(ctx, parent, 3)
	if err != nil {
		t.Fatal(err)
	}
	if len(kids) != 3 {
		t.Fatalf("children %v", kids)
	}
	pinfo, _ := s.Client.Get(ctx, parent)
	ips := map[string]bool{pinfo.IP: true}
	for i, k := range kids {
		info, err := s.Client.Get(ctx, k)
		if err != nil || info.Status != "running" || info.ParentID != parent || info.FamilyID != pinfo.FamilyID {
			t.Fatalf("child %d: %+v %v", i, info, err)
		}
		if ips[info.IP] || info.Hostname == pinfo.Hostname {
			t.Fatalf("child %d shares ip/hostname: %+v", i, info)
		}
		ips[info.IP] = true
		// Interpreter state: variables, modules, functions, arrays.
		if v := value(t, s, k, "(x, data['k'][2], helper(21), int(arr.sum()), json.dumps(1), os.environ['MODE'] if 'os' in dir() else __import__('os').environ['MODE'])"); v != "(42, 3, 42, 499500, '1', 'changed-at-runtime')" {
			t.Fatalf("child %d state: %s", i, v)
		}
		// Files at the fork, and the child's own hostname.
		if r := sh(t, s, k, "cat /root/proj/base.txt; hostname"); r.Stdout != "base\n"+info.Hostname+"\n" {
			t.Fatalf("child %d fs/hostname: %q", i, r.Stdout)
		}
		// Open files were re-opened in the child's file system at the same offset.
		value(t, s, k, fmt.Sprintf("log.write('child %d\\n'); log.flush(); 1", i))
		if r := sh(t, s, k, "cat /root/log.txt"); r.Stdout != fmt.Sprintf("before fork\nchild %d\n", i) {
			t.Fatalf("child %d log: %q", i, r.Stdout)
		}
		// Divergence: each child writes its own variable and file.
		value(t, s, k, fmt.Sprintf("x = %d; open('/root/child-%d.txt', 'w').write('mine'); 1", 100+i, i))
	}
	// Writes in children are invisible to the parent and to each other.
	if v := value(t, s, parent, "x"); v != "42" {
		t.Fatalf("parent x = %s", v)
	}
	if r := sh(t, s, parent, "ls /root; cat /root/log.txt"); strings.Contains(r.Stdout, "child-") || strings.Contains(r.Stdout, "child 0") {
		t.Fatalf("parent sees children's files: %q", r.Stdout)
	}
	for i, k := range kids {
		if v := value(t, s, k, "x"); v != fmt.Sprint(100+i) {
			t.Fatalf("child %d x = %s", i, v)
		}
		if r := sh(t, s, k, "ls /root | grep -c child-"); r.Stdout != "1\n" {
			t.Fatalf("child %d sees siblings' files: %q", i, r.Stdout)
		}
	}
	// What the parent does after the fork is invisible to the children.
	value(t, s, parent, "x = -1; open('/root/after.txt', 'w').write('late'); 1")
	if v := value(t, s, kids[0], "x"); v != "100" {
		t.Fatalf("child saw parent's later write: %s", v)
	}
	if r := sh(t, s, kids[0], "test -e /root/after.txt && echo leaked || echo ok"); r.Stdout != "ok\n" {
		t.Fatalf("child sees parent's later file")
	}
	// Children of children.
	grand, err := s.Client.Fork(ctx, kids[1], 2)
	if err != nil {
		t.Fatal(err)
	}
	if v := value(t, s, grand[1], "(x, helper(x))"); v != "(101, 202)" {
		t.Fatalf("grandchild: %s", v)
	}
	// Diff between two siblings, like the reference example.
	d, err := s.Client.Diff(ctx, kids[0], kids[1], nil)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(d.Added, []string{"/root/child-1.txt"}) || !reflect.DeepEqual(d.Removed, []string{"/root/child-0.txt"}) ||
		!reflect.DeepEqual(d.Modified, []string{"/root/log.txt"}) {
		t.Fatalf("diff = %+v", d)
	}
}

func TestForkBadInput(t *testing.T) {
	s := testserver.Start(t)
	id := create(t, s, nil)
	for _, n := range []string{`{"n": 0}`, `{"n": 33}`, `{"n": -1}`} {
		code, body := raw(t, s, "POST", "/v1/sandboxes/"+id+"/fork", s.Key, []byte(n))
		wantError(t, code, body, 400, "n must be between 1 and 32")
	}
	code, body := raw(t, s, "POST", "/v1/sandboxes/sbx_00000000000000000000000000000000/fork", s.Key, []byte(`{"n": 2}`))
	wantError(t, code, body, 404, "sandbox not found")
	code, body = raw(t, s, "POST", "/v1/sandboxes/"+id+"/fork", "", []byte(`{"n": 2}`))
	wantError(t, code, body, 401, "invalid api key")
	// Default n is 1.
	code, body = raw(t, s, "POST", "/v1/sandboxes/"+id+"/fork", s.Key, nil)
	if code != 200 || len(body["children"].([]any)) != 1 {
		t.Fatalf("default fork: %d %v", code, body)
	}
	if note, _ := body["note"].(string); !strings.Contains(note, "other processes of the parent are not cloned") {
		t.Errorf("fork response does not say what is not cloned: %v", body)
	}
	list, _ := s.Client.List(ctxT(t), client.ListOptions{})
	if len(list) != 2 {
		t.Fatalf("sandboxes after failed forks: %d", len(list))
	}
}

func TestMergeInto(t *testing.T) {
	s := testserver.Start(t)
	ctx := ctxT(t)
	parent := create(t, s, nil)
	value(t, s, parent, "x = 'parent'; 1")
	sh(t, s, parent, "echo parent > /root/who.txt")
	kids, err := s.Client.Fork(ctx, parent, 3)
	if err != nil {
		t.Fatal(err)
	}
	winner := kids[1]
	value(t, s, winner, "x = 'winner'; 1")
	sh(t, s, winner, "echo winner > /root/who.txt; sleep 1000 >/dev/null 2>&1 &")
	winfo, _ := s.Client.Get(ctx, winner)

	code, body := raw(t, s, "POST", "/v1/sandboxes/"+parent+"/merge_into/"+parent, s.Key, nil)
	wantError(t, code, body, 400, "same")
	code, body = raw(t, s, "POST", "/v1/sandboxes/"+parent+"/merge_into/sbx_00000000000000000000000000000000", s.Key, nil)
	wantError(t, code, body, 404, "sandbox not found")

	if err := s.Client.MergeInto(ctx, parent, winner); err != nil {
		t.Fatal(err)
	}
	// The parent id drives the winner's state: interpreter, files, processes, address.
	if v := value(t, s, parent, "x"); v != "'winner'" {
		t.Fatalf("parent x after merge = %s", v)
	}
	if r := sh(t, s, parent, "cat /root/who.txt; pgrep -c -f 'slee[p] 1000'"); r.Stdout != "winner\n1\n" {
		t.Fatalf("parent after merge: %q", r.Stdout)
	}
	pinfo, err := s.Client.Get(ctx, parent)
	if err != nil || pinfo.IP != winfo.IP || pinfo.Status != "running" {
		t.Fatalf("parent info after merge: %+v %v", pinfo, err)
	}
	// The winner's id is retired; a second merge of it is 404.
	if _, err := s.Client.Get(ctx, winner); !errors.Is(err, client.ErrNotFound) {
		t.Fatalf("winner after merge: %v", err)
	}
	code, body = raw(t, s, "POST", "/v1/sandboxes/"+parent+"/merge_into/"+winner, s.Key, nil)
	wantError(t, code, body, 404, "sandbox "+winner+" was merged into "+parent)
	// Siblings are untouched.
	for _, k := range []string{kids[0], kids[2]} {
		if v := value(t, s, k, "x"); v != "'parent'" {
			t.Fatalf("sibling x = %s", v)
		}
	}
	// The merged parent can fork again.
	again, err := s.Client.Fork(ctx, parent, 1)
	if err != nil {
		t.Fatal(err)
	}
	if v := value(t, s, again[0], "x"); v != "'winner'" {
		t.Fatalf("fork after merge: %s", v)
	}
}

func TestConcurrentMergesOnOneParent(t *testing.T) {
	s := testserver.Start(t)
	ctx := ctxT(t)
	parent := create(t, s, nil)
	kids, err := s.Client.Fork(ctx, parent, 2)
	if err != nil {
		t.Fatal(err)
	}
	for i, k := range kids {
		value(t, s, k, fmt.Sprintf("who = %d; 1", i))
	}
	var wg sync.WaitGroup
	errs := make([]error, 2)
	for i, k := range kids {
		wg.Add(1)
		go func(i int, k string) {
			defer wg.Done()
			errs[i] = s.Client.MergeInto(context.Background(), parent, k)
		}(i, k)
	}
	wg.Wait()
	// Both may succeed one after the other (the second merges a sibling into the already-merged parent), or the
	// second may find its winner gone; never an error other than those, and never a leak.
	ok := 0
	for _, err := range errs {
		if err == nil {
			ok++
		} else if !errors.Is(err, client.ErrNotFound) {
			t.Fatalf("merge error: %v", err)
		}
	}
	if ok == 0 {
		t.Fatal("no merge succeeded")
	}
	v := value(t, s, parent, "who")
	if v != "0" && v != "1" {
		t.Fatalf("parent after racing merges: %s", v)
	}
	list, _ := s.Client.List(ctx, client.ListOptions{})
	if len(list) != 3-ok {
		t.Fatalf("%d sandboxes left after %d merges", len(list), ok)
	}
}

// TestDiffCases runs the diff cases on real fork families: same-size content changes with the mtime put back,
// files deleted and recreated, nested directories, image files, explicit paths, parent against child, and two
// children that write a new file of the same size at once (on btrfs their first new files get the same inode
// number in each child, so only a content comparison tells them apart).
func TestDiffCases(t *testing.T) {
	s := testserver.Start(t)
	ctx := ctxT(t)
	parent := create(t, s, nil)
	sh(t, s, parent, "mkdir -p /root/nested/a/b && echo keep > /root/keep.txt && echo del > /root/del.txt && "+
		"echo c > /root/nested/a/b/c.txt && echo t > /tmp/t.txt && echo one > /root/app.log")
	kids, err := s.Client.Fork(ctx, parent, 2)
	if err != nil {
		t.Fatal(err)
	}
	k0, k1 := kids[0], kids[1]
	for i, k := range kids {
		sh(t, s, k, fmt.Sprintf("printf %s > /root/race.txt && touch -d @1700000000 /root/race.txt", strings.Repeat(string(rune('A'+i)), 4)))
	}
	sh(t, s, k1, "touch -r /root/keep.txt /tmp/ref && echo KEEP > /root/keep.txt && touch -r /tmp/ref /root/keep.txt && rm /tmp/ref && "+
		"rm /root/del.txt && echo del > /root/del.txt && "+
		"rm /root/nested/a/b/c.txt && mkdir -p /root/nested/a/x && echo y > /root/nested/a/x/y.txt && "+
		"echo longer > /tmp/t.txt && rm /etc/debian_version")
	// Appended to by the interpreter, the way a log grows (btrfs records such writes only at writeback).
	value(t, s, k1, "open('/root/app.log', 'a').write('two\\n')")

	check := func(a, b string, paths []string, added, removed, modified []string) {
		t.Helper()
		d, err := s.Client.Diff(ctx, a, b, paths)
		if err != nil {
			t.Fatal(err)
		}
		want := &client.Diff{Added: added, Removed: removed, Modified: modified}
		for _, l := range []*[]string{&want.Added, &want.Removed, &want.Modified} {
			if *l == nil {
				*l = []string{}
			}
		}
		if !reflect.DeepEqual(d, want) {
			t.Fatalf("diff %s %s %v:\n got %+v\nwant %+v", a, b, paths, d, want)
		}
	}
	check(k0, k1, nil, []string{"/root/nested/a/x/y.txt"}, []string{"/root/nested/a/b/c.txt"},
		[]string{"/root/app.log", "/root/keep.txt", "/root/race.txt", "/tmp/t.txt"})
	check(k1, k0, []string{"/root/nested"}, []string{"/root/nested/a/b/c.txt"}, []string{"/root/nested/a/x/y.txt"}, nil)
	check(k0, k1, []string{"/etc/debian_version", "/root/keep.txt"}, nil, []string{"/etc/debian_version"}, []string{"/root/keep.txt"})
	check(parent, k0, nil, []string{"/root/race.txt"}, nil, nil)
	check(parent, k1, []string{"/root/app.log"}, nil, nil, []string{"/root/app.log"})
	check(k0, k0, nil, nil, nil, nil)
	// The parent goes on after the fork; the children see none of it, the diff does.
	sh(t, s, parent, "echo late > /root/late.txt && echo KEEP > /root/keep.txt")
	check(k1, parent, []string{"/root/keep.txt", "/root/late.txt", "/root/race.txt"}, []string{"/root/late.txt"}, []string{"/root/race.txt"}, nil)
	// A grandchild against its uncle, through a removed staging snapshot and a second fork.
	grand, err := s.Client.Fork(ctx, k1, 1)
	if err != nil {
		t.Fatal(err)
	}
	sh(t, s, grand[0], "echo g > /root/nested/g.txt")
	check(k0, grand[0], []string{"/root/nested"}, []string{"/root/nested/a/x/y.txt", "/root/nested/g.txt"}, []string{"/root/nested/a/b/c.txt"}, nil)
}

// TestSpareAgents: after a fork the family keeps spare agents running; the next fork's children run on them and
// are as complete and isolated as any; spares are refilled, and go when the family's last sandbox goes.
// agentsOf lists the processes in sandbox id's cgroup whose command line holds arg.
func agentsOf(id, arg string) []int {
	var pids []int
	for _, pid := range sandboxPids(id) {
		cmd, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
		if strings.Contains(string(cmd), arg) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// TestSpareAgents: spares started by forks (none ahead of the first: --spare-agents-ahead 0).
func TestSpareAgents(t *testing.T) {
	s := testserver.Start(t, "--spare-agents-ahead", "0", "--fork-ahead", "0")
	ctx := ctxT(t)
	parent := create(t, s, nil)
	value(t, s, parent, "x = 10; 1")
	initPid := familyInit(t, parent)
	if n := len(spareAgents(initPid)); n != 0 {
		t.Fatalf("%d spares before any fork", n)
	}
	first, err := s.Client.Fork(ctx, parent, 3)
	if err != nil {
		t.Fatal(err)
	}
	// The family had none placed: the first fork started spares for its children as it began (topUpSpares),
	// rather than an agent per child after its clones.
	for _, k := range first {
		if n := len(agentsOf(k, "--spare")); n != 1 {
			t.Errorf("first fork's child %s: %d agents started as spares, want 1", k, n)
		}
	}
	waitSpares(t, initPid, 3)
	idle := spareAgents(initPid)
	second, err := s.Client.Fork(ctx, parent, 3)
	if err != nil {
		t.Fatal(err)
	}
	// The second fork's agents are the spares (now in the children's cgroups).
	var claimed []int
	for _, k := range second {
		claimed = append(claimed, agentsOf(k, "__agent")...)
	}
	slices.Sort(idle)
	slices.Sort(claimed)
	if !slices.Equal(idle, claimed) {
		t.Fatalf("second fork's agents %v, want the spares %v", claimed, idle)
	}
	hosts := map[string]bool{}
	for i, k := range second {
		if v := value(t, s, k, fmt.Sprintf("x += %d; x", i)); v != fmt.Sprint(10+i) {
			t.Fatalf("child %d: x = %s", i, v)
		}
		r := sh(t, s, k, fmt.Sprintf("echo %d > /root/mine.txt && hostname && cat /root/mine.txt && ls /root", i))
		lines := strings.Split(strings.TrimSpace(r.Stdout), "\n")
		if len(lines) != 3 || lines[1] != fmt.Sprint(i) || lines[2] != "mine.txt" {
			t.Fatalf("child %d on a spare agent: %q", i, r.Stdout)
		}
		hosts[lines[0]] = true
	}
	if len(hosts) != 3 {
		t.Fatalf("hostnames %v", hosts)
	}
	// A spare's cgroup and port were made before its claim: each child still has its parent's limits, and its
	// own address on its eth0.
	for _, k := range second {
		for _, f := range []string{"memory/memory.limit_in_bytes", "memory/memory.memsw.limit_in_bytes", "cpu/cpu.cfs_quota_us",
			"cpu/cpu.cfs_period_us", "pids/pids.max"} {
			if got, want := cgroupValue(t, k, f), cgroupValue(t, parent, f); got != want {
				t.Errorf("child %s on a spare: %s = %s, its parent's is %s", k, f, got, want)
			}
		}
		sb, err := s.Client.Get(ctx, k)
		if err != nil {
			t.Fatal(err)
		}
		eth0 := "import socket, fcntl, struct\n" +
			"sk = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n" +
			"socket.inet_ntoa(fcntl.ioctl(sk.fileno(), 0x8915, struct.pack('256s', b'eth0'))[20:24])"
		if got := strings.Trim(value(t, s, k, eth0), "'"); got != sb.IP || sb.IP == "" {
			t.Errorf("child %s on a spare: eth0 has %s, its record %q", k, got, sb.IP)
		}
	}
	if err := killOther(t, s, second[0], second[1]); err != nil {
		t.Fatal(err)
	}
	waitSpares(t, initPid, 3)
	// The family goes with its last sandbox, spares and all.
	for _, id := range append(append([]string{parent}, first...), second...) {
		if err := s.Client.Delete(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	waitUntil(t, 10*time.Second, func() bool { return procField(initPid, "PPid") == "" && len(spareAgents(initPid)) == 0 },
		func() string {
			return fmt.Sprintf("family init %d or its spares %v outlive the family", initPid, spareAgents(initPid))
		})
}

// TestSparesAheadOfFirstFork: a sandbox that runs code gets spares in its family before it ever forks (each in
// a cgroup of its own, no port on the host yet), and its first fork's children run on them. The server-wide
// budget (here one family's worth) goes to the sandbox that ran code most recently once its holder has had it a
// while (5 s), and what the holder gives up is gone: the spare agents and their cgroups. The family that lost
// them still forks.
func TestSparesAheadOfFirstFork(t *testing.T) {
	s := testserver.Start(t, "--spare-agents-ahead", "5", "--fork-ahead", "0")
	ctx := ctxT(t)
	a := create(t, s, nil)
	initA := familyInit(t, a)
	if n := len(spareAgents(initA)); n != 0 {
		t.Fatalf("%d spares before the sandbox ran code", n)
	}
	value(t, s, a, "x = 1; x")
	granted := time.Now()
	waitSpares(t, initA, 5)
	aheadA := spareAgents(initA)
	var cgs, ports []string
	waitUntil(t, 10*time.Second, func() bool {
		cgs, ports = spareCgroupsAndPorts(aheadA)
		return len(cgs) == 5
	}, func() string { return fmt.Sprintf("spares ahead placed in cgroups %v, want 5", cgs) })
	// No port is made for them: a veth appearing on the host would abort a local browser's requests in flight
	// (the console's run_code), and they start while the sandbox's run_code runs.
	if len(ports) != 0 {
		t.Errorf("spares ahead have ports %v, want none until a fork claims them", ports)
	}

	// b runs code while a has held the budget less than 5 s: b gets none.
	b := create(t, s, nil)
	initB := familyInit(t, b)
	value(t, s, b, "y = 2; y")
	time.Sleep(time.Second)
	if n := len(spareAgents(initB)); n != 0 {
		t.Fatalf("b got %d spares while a held the budget for less than its hold", n)
	}
	// Past the hold, b's next run_code takes the budget; a's spares go, with everything placed for them.
	time.Sleep(time.Until(granted.Add(5500 * time.Millisecond)))
	value(t, s, b, "y")
	waitSpares(t, initB, 5)
	aheadB := spareAgents(initB)
	waitUntil(t, 10*time.Second, func() bool {
		if len(spareAgents(initA)) != 0 {
			return false
		}
		for _, cg := range cgs {
			if _, err := os.Stat(cg); err == nil {
				return false
			}
		}
		for _, port := range ports {
			if _, err := os.Stat("/sys/class/net/" + port); err == nil {
				return false
			}
		}
		return true
	}, func() string {
		return fmt.Sprintf("a's spares after it gave up the budget: %d agents left (cgroups %v, ports %v were to go)", len(spareAgents(initA)), cgs, ports)
	})

	// b's first fork runs on the spares started ahead; a forks without any.
	kids, err := s.Client.Fork(ctx, b, 3)
	if err != nil {
		t.Fatal(err)
	}
	for i, k := range kids {
		agents := agentsOf(k, "__agent")
		if len(agents) != 1 || !slices.Contains(aheadB, agents[0]) {
			t.Errorf("child %s: agent %v, want one of the spares started ahead %v", k, agents, aheadB)
		}
		if v := value(t, s, k, fmt.Sprintf("y + %d", i)); v != fmt.Sprint(2+i) {
			t.Errorf("child %s: y + %d = %s", k, i, v)
		}
	}
	kidsA, err := s.Client.Fork(ctx, a, 2)
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range kidsA {
		if v := value(t, s, k, "x"); v != "1" {
			t.Errorf("a's child %s: x = %s", k, v)
		}
	}
}

// TestSparesAheadLapse: spares started ahead retire when idle (--spare-agents-idle), and the sandbox's next
// run_code starts them again: a grant does not outlive its spares.
func TestSparesAheadLapse(t *testing.T) {
	s := testserver.Start(t, "--spare-agents-idle", "2s", "--fork-ahead", "0")
	a := create(t, s, nil)
	initA := familyInit(t, a)
	value(t, s, a, "1")
	waitSpares(t, initA, 5)
	waitUntil(t, 15*time.Second, func() bool { return len(spareAgents(initA)) == 0 },
		func() string {
			return fmt.Sprintf("%d spares ahead still idle past their idle limit", len(spareAgents(initA)))
		})
	value(t, s, a, "2")
	waitSpares(t, initA, 5)
}

// spareCgroupsAndPorts finds, for each spare agent (host pid), the directory of its cgroup in the pids hierarchy
// (<family>.s<pid in the family>) and the host-side name of its prepared port, where it has them.
func spareCgroupsAndPorts(spares []int) (cgs, ports []string) {
	for _, pid := range spares {
		b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
		for _, l := range strings.Split(string(b), "\n") {
			parts := strings.SplitN(l, ":", 3)
			if len(parts) != 3 || parts[1] != "pids" {
				continue
			}
			name := filepath.Base(parts[2])
			fam, nsPid, ok := strings.Cut(name, ".s")
			if !ok {
				continue
			}
			cgs = append(cgs, "/sys/fs/cgroup/pids"+parts[2])
			if port := network.SparePortName(fam + "/" + nsPid); port != "" {
				if _, err := os.Stat("/sys/class/net/" + port); err == nil {
					ports = append(ports, port)
				}
			}
		}
	}
	return cgs, ports
}

// cgroupValue reads file (under its controller, e.g. "pids/pids.max") of sandbox id's cgroup (cgroup v1).
func cgroupValue(t *testing.T, id, file string) string {
	t.Helper()
	ctrl, name, _ := strings.Cut(file, "/")
	paths, _ := filepath.Glob("/sys/fs/cgroup/" + ctrl + "/ramify/*/" + id + "/" + name)
	if len(paths) != 1 {
		t.Skipf("no cgroup v1 file %s for %s (found %v)", file, id, paths)
	}
	b, err := os.ReadFile(paths[0])
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(b))
}

// killOther checks that a sandbox cannot kill another's interpreter (here: on agents that were spares).
func killOther(t *testing.T, s *testserver.Server, from, to string) error {
	t.Helper()
	pid := strings.TrimSpace(value(t, s, to, "import os; os.getpid()"))
	r := sh(t, s, from, "kill -9 "+pid+" 2>&1; echo rc=$?")
	if !strings.Contains(r.Stdout, "rc=1") {
		return fmt.Errorf("kill of another sandbox's interpreter: %q", r.Stdout)
	}
	if v := value(t, s, to, "1 + 1"); v != "2" {
		return fmt.Errorf("the other interpreter: %s", v)
	}
	return nil
}

// TestSpareAgentsRetireWhenIdle: spares unused for --spare-agents-idle go, while the family's sandboxes stay; the
// next fork then starts its agents and works as before.
func TestSpareAgentsRetireWhenIdle(t *testing.T) {
	s := testserver.Start(t, "--spare-agents-idle", "1s", "--fork-ahead", "0")
	ctx := ctxT(t)
	parent := create(t, s, nil)
	value(t, s, parent, "x = 7; 1")
	initPid := familyInit(t, parent)
	if _, err := s.Client.Fork(ctx, parent, 2); err != nil {
		t.Fatal(err)
	}
	waitSpares(t, initPid, 2)
	waitUntil(t, 15*time.Second, func() bool { return len(spareAgents(initPid)) == 0 },
		func() string {
			return fmt.Sprintf("idle spares %v still there after 15 s with a 1 s idle limit", spareAgents(initPid))
		})
	if procField(initPid, "PPid") == "" {
		t.Fatal("the family init went with its spares")
	}
	kids, err := s.Client.Fork(ctx, parent, 2)
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range append(kids, parent) {
		if v := value(t, s, k, "x"); v != "7" {
			t.Fatalf("%s after the spares retired: x = %s", k, v)
		}
	}
}

// A fork child's fd-level output (a subprocess's, C code's) is its own: it shows in the child's run, never in
// the parent's (even while the parent runs code), and still works once the parent is gone; so for a child's
// child.
func TestForkChildFdOutputStaysInTheChild(t *testing.T) {
	s := testserver.Start(t)
	ctx := ctxT(t)
	parent := create(t, s, nil)
	if ex := run(t, s, parent, "import os, time; rc = os.system('echo parent-fd'); rc"); ex.Stdout != "parent-fd\n" {
		t.Fatalf("parent's fd output: %q", ex.Stdout)
	}
	kids, err := s.Client.Fork(ctx, parent, 2)
	if err != nil {
		t.Fatal(err)
	}
	// The parent runs while its children write at fd level: none of their output may reach its run.
	parentRun := make(chan *client.Execution, 1)
	go func() {
		ex, err := s.Client.RunCode(ctx, parent, client.RunCodeRequest{Code: "time.sleep(1.5); print('parent-py')"})
		if err != nil {
			t.Error(err)
		}
		parentRun <- ex
	}()
	time.Sleep(200 * time.Millisecond)
	for i, k := range kids {
		code := fmt.Sprintf("rc = os.system('echo child%d-out; echo child%d-err >&2'); print('py', rc)", i, i)
		ex := run(t, s, k, code)
		if want := fmt.Sprintf("child%d-out\npy 0", i); sortedLines(ex.Stdout) != want || ex.Stderr != fmt.Sprintf("child%d-err\n", i) {
			t.Fatalf("child %d: stdout %q stderr %q, want %q and its stderr line", i, ex.Stdout, ex.Stderr, want)
		}
	}
	if ex := <-parentRun; ex == nil || ex.Stdout != "parent-py\n" || ex.Stderr != "" {
		t.Fatalf("the parent's run got other output: %+v", ex)
	}
	grand, err := s.Client.Fork(ctx, kids[0], 1)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.Client.Delete(ctx, parent); err != nil {
		t.Fatal(err)
	}
	if err := s.Client.Delete(ctx, kids[0]); err != nil {
		t.Fatal(err)
	}
	for _, id := range []string{kids[1], grand[0]} {
		ex := run(t, s, id, "import subprocess; r = subprocess.run(['sh', '-c', 'echo sub-out; echo sub-err >&2']); print('rc', r.returncode)")
		if sortedLines(ex.Stdout) != "rc 0\nsub-out" || ex.Stderr != "sub-err\n" {
			t.Fatalf("%s after its parent was deleted: stdout %q stderr %q", id, ex.Stdout, ex.Stderr)
		}
	}
}

// TestForkManyChildren: above directCloneMax children the parent is frozen only for one staging snapshot, which
// the children's layers are cloned from. Every child still starts from the parent's files and memory, and the
// staging snapshot is gone afterwards.
func TestForkManyChildren(t *testing.T) {
	s := testserver.Start(t)
	ctx := ctxT(t)
	parent := create(t, s, nil)
	value(t, s, parent, "x = 41\nopen('/root/state.txt', 'w').write('from the parent')\n1")
	var res struct {
		Children      []string `json:"children"`
		ParentPauseMs float64  `json:"parent_pause_ms"`
	}
	if err := s.PostJSON(ctx, "/v1/sandboxes/"+parent+"/fork", map[string]int{"n": 10}, &res); err != nil {
		t.Fatal(err)
	}
	if len(res.Children) != 10 || res.ParentPauseMs <= 0 {
		t.Fatalf("fork(10): %+v", res)
	}
	for i, k := range res.Children {
		if v := value(t, s, k, fmt.Sprintf("x += %d; x", i)); v != fmt.Sprint(41+i) {
			t.Errorf("child %d: x = %s, want %d", i, v, 41+i)
		}
		if r := sh(t, s, k, fmt.Sprintf("cat /root/state.txt && echo %d > /root/state.txt", i)); r.Stdout != "from the parent" {
			t.Errorf("child %d: /root/state.txt = %q", i, r.Stdout)
		}
	}
	if r := sh(t, s, parent, "cat /root/state.txt"); r.Stdout != "from the parent" {
		t.Errorf("the parent's file after its children wrote theirs: %q", r.Stdout)
	}
	waitUntil(t, 10*time.Second, func() bool {
		for _, l := range s.Inventory().Layers {
			if strings.HasPrefix(l, "fork-") {
				return false
			}
		}
		return true
	}, func() string { return fmt.Sprintf("a fork's staging snapshot is left: %v", s.Inventory().Layers) })
}

// TestConcurrentForksInOneFamily: forks of a parent and of its child run at once in one family, which has fewer
// spares than they need together: one may take spares ahead (reserve) while the other claims whatever is idle,
// and neither may take the other's. Every fork succeeds, and every child answers.
func TestConcurrentForksInOneFamily(t *testing.T) {
	s := testserver.Start(t, "--fork-ahead", "0") // counts spares, which children made ahead would take
	ctx := ctxT(t)
	parent := create(t, s, nil)
	value(t, s, parent, "x = 7; 1")
	initPid := familyInit(t, parent)
	first, err := s.Client.Fork(ctx, parent, 4)
	if err != nil {
		t.Fatal(err)
	}
	other := first[0]
	for round := 0; round < 4; round++ {
		waitSpares(t, initPid, 3) // fewer than the 6 children the two forks need together
		var wg sync.WaitGroup
		kids := make([][]string, 2)
		errs := make([]error, 2)
		for i, id := range []string{parent, other} {
			wg.Add(1)
			go func() {
				defer wg.Done()
				kids[i], errs[i] = s.Client.Fork(ctx, id, 3)
			}()
		}
		wg.Wait()
		for i := range kids {
			if errs[i] != nil {
				t.Fatalf("round %d: fork %d: %v", round, i, errs[i])
			}
			for _, k := range kids[i] {
				if v := value(t, s, k, "x"); v != "7" {
					t.Fatalf("round %d: child %s: x = %s", round, k, v)
				}
				if err := s.Client.Delete(ctx, k); err != nil {
					t.Fatal(err)
				}
			}
		}
	}
}
