package integration

import (
	"context"
	"fmt"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/ramify-dev/ramify/client"
	"github.com/ramify-dev/ramify/internal/crashpoint"
	"github.com/ramify-dev/ramify/internal/network"
	"github.com/ramify-dev/ramify/internal/testserver"
)

// The crash tests kill the server (SIGKILL, from inside, at a named phase: internal/crashpoint) in the middle of
// a fork, a pause, a create, a resume, a merge and a fork of a paused sandbox, restart it on the same data
// directory, and check from the outside that nothing is left that no live sandbox owns (cgroups, layers, veths,
// nftables pins, family inits, stray agents, snapshots and their temporary files) and that the survivors work.

// expect is what a server should have on the host beyond its running sandboxes' resources.
type expect struct {
	filesOf   []string // sandboxes in error that keep their layer
	snapshots []string // sandboxes whose snapshot is kept
	// renamed maps a sandbox to the id its resources are named after (a merge's parent runs the winner's).
	renamed map[string]string
}

// checkNoLeftovers waits (up to 20 s: killed processes are reaped and veths vanish asynchronously) until the
// server's inventory is exactly what its sandboxes own, and fails with both when it is not.
func checkNoLeftovers(t *testing.T, s *testserver.Server, ex expect) {
	t.Helper()
	ctx := ctxT(t)
	var inv testserver.Inventory
	var why string
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		list, err := s.Client.List(ctx, client.ListOptions{})
		if err != nil {
			t.Fatal(err)
		}
		inv = s.Inventory()
		if why = mismatch(list, inv, ex); why == "" {
			return
		}
		if time.Now().After(deadline) {
			break
		}
	}
	t.Fatalf("leftovers after the restart: %s\ninventory: %+v\nserver log:\n%s", why, inv, s.Log())
}

// mismatch says how inv differs from what list and ex own ("" when it does not).
func mismatch(list []client.Sandbox, inv testserver.Inventory, ex expect) string {
	var running, veths []string
	families := map[string]bool{}
	for _, sb := range list {
		if sb.Status == "running" {
			name := sb.ID
			if n, ok := ex.renamed[name]; ok {
				name = n
			}
			running = append(running, name)
			veths = append(veths, network.VethName(name))
			families[sb.FamilyID] = true
		}
	}
	sort.Strings(running)
	sort.Strings(veths)
	layers := append(slices.Clone(running), ex.filesOf...)
	sort.Strings(layers)
	snaps := slices.Clone(ex.snapshots)
	sort.Strings(snaps)
	// A cgroup per running sandbox and one per family (its init's).
	cgs := slices.Clone(running)
	for f := range families {
		cgs = append(cgs, f)
	}
	sort.Strings(cgs)
	// A running family's spare agents may sit in cgroups of their own, <family>.s<pid>.
	var have []string
	for _, c := range inv.Cgroups {
		if fam, _, ok := strings.Cut(c, ".s"); ok && families[fam] {
			continue
		}
		have = append(have, c)
	}
	switch {
	case !slices.Equal(have, cgs):
		return fmt.Sprintf("cgroups %v, want %v", inv.Cgroups, cgs)
	case !slices.Equal(inv.Layers, layers):
		return fmt.Sprintf("layers %v, want %v", inv.Layers, layers)
	case !slices.Equal(inv.Veths, veths):
		return fmt.Sprintf("veths %v, want %v", inv.Veths, veths)
	case !slices.Equal(inv.Pins, veths):
		return fmt.Sprintf("nftables pins %v, want %v", inv.Pins, veths)
	case len(inv.Inits) != len(families):
		return fmt.Sprintf("%d family inits, want %d", len(inv.Inits), len(families))
	case len(inv.StrayAgents) != 0:
		return fmt.Sprintf("stray agents %v", inv.StrayAgents)
	case !slices.Equal(inv.Snapshots, snaps):
		return fmt.Sprintf("snapshots of %v, want %v", inv.Snapshots, snaps)
	case len(inv.SnapshotTemps) != 0:
		return fmt.Sprintf("snapshot temporary files %v", inv.SnapshotTemps)
	}
	return ""
}

// crashDuring restarts s to crash at point, runs op (which fails: the server dies under it), waits for the
// crash, and restarts s normally.
func crashDuring(t *testing.T, s *testserver.Server, point string, op func(ctx context.Context) error) {
	t.Helper()
	s.RestartCrashingAt(point)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	if err := op(ctx); err == nil {
		t.Fatalf("%s: the operation succeeded; the server should have died under it", point)
	}
	s.WaitCrash(time.Minute)
	s.Restart()
}

func TestCrashMidOperationLeavesNothingBehind(t *testing.T) {
	// Another server on the same host, with its own data directory: its restarts' reclaims must not touch it.
	other := testserver.Start(t, "--warm-pool", "0", "--fork-ahead", "0")
	bystander := create(t, other, nil)
	value(t, other, bystander, "x = 41; 1")
	// Having run code, the bystander's family gets 5 spare agents ahead of a first fork (each in a cgroup of its
	// own, with no port yet): they are among what must survive this server's reclaims.
	var otherInv testserver.Inventory
	waitUntil(t, 15*time.Second, func() bool {
		otherInv = other.Inventory()
		spareCgs := slices.IndexFunc(otherInv.Cgroups, func(c string) bool { return strings.Contains(c, ".s") })
		ports := 0
		for _, v := range otherInv.Veths {
			if strings.HasPrefix(v, "rfs") {
				ports++
			}
		}
		return spareCgs >= 0 && len(otherInv.Cgroups) == 2+5 && ports == 0
	}, func() string { return fmt.Sprintf("the bystander's spares ahead not placed: %+v", otherInv) })
	s := testserver.Start(t, "--warm-pool", "0", "--fork-ahead", "0") // children made ahead: ahead_test.go
	ctx := ctxT(t)
	defer func() {
		if got := other.Inventory(); fmt.Sprint(got) != fmt.Sprint(otherInv) {
			t.Errorf("another server's resources changed: %+v, was %+v", got, otherInv)
		}
		if got := value(t, other, bystander, "x + 1"); got != "42" {
			t.Errorf("another server's sandbox: x + 1 = %s", got)
		}
	}()
	keep := create(t, s, nil)
	value(t, s, keep, "x = 41; 1")
	sh(t, s, keep, "echo kept > /root/f.txt")
	checkNoLeftovers(t, s, expect{})
	alive := func(id string) {
		t.Helper()
		if got := value(t, s, id, "x + 1"); got != "42" {
			t.Fatalf("%s after the restart: x + 1 = %s", id, got)
		}
		if got := sh(t, s, id, "cat /root/f.txt").Stdout; got != "kept\n" {
			t.Fatalf("%s after the restart: f.txt = %q", id, got)
		}
	}

	t.Run("fork", func(t *testing.T) {
		for _, point := range []string{crashpoint.ForkAfterChildren, crashpoint.ForkAfterInterpreters} {
			crashDuring(t, s, point, func(ctx context.Context) error { _, err := s.Client.Fork(ctx, keep, 5); return err })
			checkNoLeftovers(t, s, expect{})
			alive(keep)
		}
		kids, err := s.Client.Fork(ctx, keep, 2)
		if err != nil {
			t.Fatalf("fork after the restarts: %v", err)
		}
		for _, k := range kids {
			alive(k)
			s.Client.Delete(ctx, k)
		}
	})

	big := create(t, s, nil)
	value(t, s, big, "import os; blob = os.urandom(24 << 20); x = 41; len(blob)")
	sh(t, s, big, "echo kept > /root/f.txt; head -c 8M /dev/urandom > /root/big.bin")
	t.Run("pause", func(t *testing.T) {
		for _, point := range []string{crashpoint.SnapshotBeforePublish, crashpoint.PauseAfterSession, crashpoint.PauseAfterLayer} {
			crashDuring(t, s, point, func(ctx context.Context) error {
				if _, _, err := s.Client.Pause(ctx, big); err != nil {
					return err
				}
				_, err := s.Client.WaitStatus(ctx, big, "paused")
				return err
			})
			checkNoLeftovers(t, s, expect{})
			alive(big) // running again, thawed, its interpreter intact
		}
	})

	t.Run("resume", func(t *testing.T) {
		pauseAndWait(t, s, big)
		crashDuring(t, s, crashpoint.ResumeAfterCreate, func(ctx context.Context) error {
			if _, _, err := s.Client.Resume(ctx, big); err != nil {
				return err
			}
			_, err := s.Client.WaitStatus(ctx, big, "running")
			return err
		})
		// Paused again with its snapshot kept, as before the resume, the interruption in pause.error; the
		// half-resumed sandbox is gone.
		checkNoLeftovers(t, s, expect{snapshots: []string{big}})
		if sb, err := s.Client.Get(ctx, big); err != nil || sb.Status != "paused" || sb.Pause == nil ||
			!strings.Contains(sb.Pause.Error, "server restart") {
			t.Fatalf("after a restart in the middle of its resume: %+v %v; want paused, pause.error saying the restart", sb, err)
		}
		if _, _, err := s.Client.Resume(ctx, big); err != nil {
			t.Fatal(err)
		}
		if sb, err := s.Client.WaitStatus(ctx, big, "running"); err != nil || sb.Status != "running" {
			t.Fatalf("resume after the restart: %+v %v", sb, err)
		}
		alive(big)
	})

	t.Run("fork of a paused sandbox", func(t *testing.T) {
		pauseAndWait(t, s, big)
		crashDuring(t, s, crashpoint.ForkPausedAfterCopies, func(ctx context.Context) error {
			_, err := s.Client.Fork(ctx, big, 3)
			return err
		})
		checkNoLeftovers(t, s, expect{snapshots: []string{big}})
	})

	t.Run("create", func(t *testing.T) {
		var made []string
		for _, point := range []string{crashpoint.CreateAfterLayer, crashpoint.CreateAfterSpawn} {
			before, _ := s.Client.List(ctx, client.ListOptions{})
			crashDuring(t, s, point, func(ctx context.Context) error { _, err := s.Client.Create(ctx, client.CreateRequest{}); return err })
			after, _ := s.Client.List(ctx, client.ListOptions{})
			// The interrupted creation is a sandbox in error that keeps its (empty) files until deleted.
			for _, sb := range after {
				if !slices.ContainsFunc(before, func(b client.Sandbox) bool { return b.ID == sb.ID }) {
					if sb.Status != "error" {
						t.Fatalf("interrupted creation %s is %s", sb.ID, sb.Status)
					}
					made = append(made, sb.ID)
				}
			}
			checkNoLeftovers(t, s, expect{filesOf: made, snapshots: []string{big}})
		}
		for _, id := range made {
			if err := s.Client.Delete(ctx, id); err != nil {
				t.Fatal(err)
			}
		}
		checkNoLeftovers(t, s, expect{snapshots: []string{big}})
	})

	t.Run("delete", func(t *testing.T) {
		// A running sandbox with a fork sibling (its family lives on: its agent is a stray in it) and a paused
		// one (its snapshot stays in the store): the delete's record is gone when the server dies, and the
		// restart removes the rest. Before, the record went last: the restart listed a half-deleted sandbox
		// in error ("lost when the server restarted").
		kids, err := s.Client.Fork(ctx, keep, 2)
		if err != nil {
			t.Fatal(err)
		}
		pauseAndWait(t, s, kids[1])
		for i, id := range kids {
			crashDuring(t, s, crashpoint.DestroyAfterRetire, func(ctx context.Context) error { return s.Client.Delete(ctx, id) })
			if sb, err := s.Client.Get(ctx, id); err == nil {
				t.Fatalf("%s after a restart that cut its delete: %+v", id, sb)
			} else if !strings.Contains(err.Error(), "deleted") {
				t.Errorf("%s after a restart that cut its delete: %v, want a 404 that says it was deleted", id, err)
			}
			snapshots := []string{big}
			if i == 0 {
				snapshots = append(snapshots, kids[1]) // paused, not deleted yet
			}
			checkNoLeftovers(t, s, expect{snapshots: snapshots})
		}
		alive(keep)
	})

	t.Run("merge", func(t *testing.T) {
		for i, point := range []string{crashpoint.MergeAfterCommit, crashpoint.MergeAfterSwap} {
			kids, err := s.Client.Fork(ctx, keep, 1)
			if err != nil {
				t.Fatal(err)
			}
			value(t, s, kids[0], fmt.Sprintf("y = %d; 1", i))
			crashDuring(t, s, point, func(ctx context.Context) error { return s.Client.MergeInto(ctx, keep, kids[0]) })
			// The merge was recorded before the runtime swapped: the restart finishes it, and reclaims the
			// parent's old processes, cgroup, veth and layer.
			checkNoLeftovers(t, s, expect{snapshots: []string{big}, renamed: map[string]string{keep: kids[0]}})
			if got := value(t, s, keep, "y"); got != fmt.Sprint(i) {
				t.Fatalf("%s: the parent's y = %s after the restart, want the winner's %d", point, got, i)
			}
			alive(keep)
			if _, err := s.Client.Get(ctx, kids[0]); err == nil {
				t.Fatalf("%s: the winner's id still answers after the restart", point)
			}
		}
	})
}

// TestCrashMidWarmFillLeavesNothingBehind: a server killed while it starts a warm sandbox leaves that sandbox's
// family, cgroup, veth and layer; the next start reclaims them and fills its pool afresh.
func TestCrashMidWarmFillLeavesNothingBehind(t *testing.T) {
	s := testserver.Start(t, "--warm-pool", "1")
	for _, point := range []string{crashpoint.CreateAfterLayer, crashpoint.CreateAfterSpawn} {
		s.RestartCrashingAt(point) // the pool's fill reaches it at start
		s.WaitCrash(time.Minute)
		s.Restart()
		// One warm sandbox, invisible to the API: exactly one of each resource, none of the crashed fill's.
		var inv testserver.Inventory
		for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(50 * time.Millisecond) {
			inv = s.Inventory()
			// Cgroups: the sandbox's and its family's.
			if len(inv.Cgroups) == 2 && len(inv.Layers) == 1 && slices.Contains(inv.Cgroups, inv.Layers[0]) && len(inv.Veths) == 1 &&
				slices.Equal(inv.Pins, inv.Veths) && len(inv.Inits) == 1 && len(inv.StrayAgents) == 0 {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: after the restart the host has %+v, want one warm sandbox's resources\n%s", point, inv, s.Log())
			}
		}
	}
	id := create(t, s, nil)
	if got := value(t, s, id, "1 + 1"); got != "2" {
		t.Fatalf("create after the restarts: %s", got)
	}
}
