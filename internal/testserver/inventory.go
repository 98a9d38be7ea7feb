package testserver

import (
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"github.com/google/nftables"
	"github.com/ramify-dev/ramify/internal/network"
	"github.com/vishvananda/netlink"
)

// Inventory is what a server's data directory has on the host, found the way an outsider would: cgroups under
// its parent (but its hidden keeper), layers under its data directory, veths on its bridge (or marked as its),
// its nftables pins, its family inits, agents of its families that are in no sandbox cgroup, and its snapshot
// store's objects and temporary files. Each list is sorted.
type Inventory struct {
	Cgroups       []string // cgroup names under ramify/<digest>
	Layers        []string // layer ids
	Veths         []string // host veths on the bridge or with the server's alias
	Pins          []string // ports pinned in the bridge's nftables table
	Inits         []int    // pids of family inits tagged with the server's owner
	StrayAgents   []int    // non-spare agents of those families in no sandbox cgroup
	Snapshots     []string // sandbox ids with objects in the local snapshot store
	SnapshotTemps []string // temporary files of the local snapshot store
}

// Owner is the digest that names the server's cgroup parent, family inits and veths.
func (s *Server) Owner() string {
	sum := sha256.Sum256([]byte(s.DataDir))
	return hex.EncodeToString(sum[:4])
}

// Bridge is the server's bridge.
func (s *Server) Bridge() string { return s.bridge }

// Inventory lists what the server's data directory has on the host now.
func (s *Server) Inventory() Inventory {
	var inv Inventory
	owner := s.Owner()
	cg := map[string]bool{}
	for _, pat := range []string{"/sys/fs/cgroup/*/ramify/" + owner + "/*", "/sys/fs/cgroup/ramify/" + owner + "/*"} {
		ds, _ := filepath.Glob(pat)
		for _, d := range ds {
			// Not the server's own hidden ones (cgroups v1: the frozen keeper, which is no sandbox's).
			if st, err := os.Stat(d); err == nil && st.IsDir() && !strings.HasPrefix(filepath.Base(d), ".") {
				cg[filepath.Base(d)] = true
			}
		}
	}
	inv.Cgroups = keys(cg)
	layers := filepath.Join(s.DataDir, "layers")
	if st, err := os.Stat(filepath.Join(layers, "layers")); err == nil && st.IsDir() {
		layers = filepath.Join(layers, "layers") // the loop-mounted btrfs image
	}
	ents, _ := os.ReadDir(layers)
	for _, e := range ents {
		if n := e.Name(); e.IsDir() && !strings.HasPrefix(n, ".") && n != "layers" {
			inv.Layers = append(inv.Layers, n)
		}
	}
	if br, err := netlink.LinkByName(s.bridge); err == nil {
		links, _ := network.Links()
		for _, l := range links {
			if a := l.Attrs(); a.MasterIndex == br.Attrs().Index || a.Alias == "ramify:"+owner {
				inv.Veths = append(inv.Veths, a.Name)
			}
		}
	}
	if c, err := nftables.New(); err == nil {
		set, err := c.GetSetByName(&nftables.Table{Name: "ramify_" + s.bridge, Family: nftables.TableFamilyBridge}, "pins")
		if err == nil {
			els, _ := c.GetSetElements(set)
			for _, e := range els {
				if len(e.Key) >= 16 {
					inv.Pins = append(inv.Pins, strings.TrimRight(string(e.Key[:16]), "\x00"))
				}
			}
		}
	}
	inv.Inits, inv.StrayAgents = s.processes(owner)
	objs, _ := os.ReadDir(filepath.Join(s.DataDir, "snapshots", "objects"))
	for _, e := range objs {
		inv.Snapshots = append(inv.Snapshots, e.Name())
	}
	tmps, _ := os.ReadDir(filepath.Join(s.DataDir, "snapshots", "tmp"))
	for _, e := range tmps {
		inv.SnapshotTemps = append(inv.SnapshotTemps, e.Name())
	}
	sort.Strings(inv.Layers)
	sort.Strings(inv.Veths)
	sort.Strings(inv.Pins)
	return inv
}

// processes finds the server's family inits and the non-spare agents they started that are in none of the
// server's sandbox cgroups.
func (s *Server) processes(owner string) (inits, stray []int) {
	want := "ramify\x00__init\x00--owner=" + owner + "\x00"
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		// PID 1 of its namespace: a child the init is starting (a spare agent, before its exec) has the init's
		// command line too.
		if b, _ := os.ReadFile("/proc/" + e.Name() + "/cmdline"); string(b) == want && innermostPid(pid) == 1 {
			inits = append(inits, pid)
		}
	}
	sort.Ints(inits)
	for _, ip := range inits {
		tasks, _ := filepath.Glob("/proc/" + strconv.Itoa(ip) + "/task/*/children")
		for _, t := range tasks {
			b, _ := os.ReadFile(t)
			for _, f := range strings.Fields(string(b)) {
				cmd, _ := os.ReadFile("/proc/" + f + "/cmdline")
				cgs, _ := os.ReadFile("/proc/" + f + "/cgroup")
				args := strings.Split(string(cmd), "\x00")
				if len(args) < 3 || args[1] != "__agent" || args[2] == "--spare" || strings.Contains(string(cgs), "/ramify/"+owner+"/") {
					continue
				}
				if pid, err := strconv.Atoi(f); err == nil {
					stray = append(stray, pid)
				}
			}
		}
	}
	return inits, stray
}

// innermostPid is pid's pid in its innermost PID namespace (the last NSpid field of its status), or 0.
func innermostPid(pid int) int {
	b, _ := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	for _, l := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(l, "NSpid:"); ok {
			f := strings.Fields(rest)
			if len(f) > 0 {
				n, _ := strconv.Atoi(f[len(f)-1])
				return n
			}
		}
	}
	return 0
}

func keys(m map[string]bool) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}
