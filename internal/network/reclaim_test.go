package network

import (
	"context"
	"slices"
	"sort"
	"testing"

	"github.com/google/nftables"
	"github.com/ramify-dev/ramify/internal/testnet"
	"github.com/vishvananda/netlink"
)

// TestReclaimOnlyOwnPorts: Reclaim detaches the marked ports keep does not claim (veth and nftables elements),
// keeps the claimed one, and leaves a veth marked as another server's, and one not marked at all, alone; a
// second run finds nothing.
func TestReclaimOnlyOwnPorts(t *testing.T) {
	m := newTestManager(t, func(c *Config) { c.Owner = "owner-a" })
	names := map[string]string{}
	for _, role := range []string{"kept", "leftover", "other", "unmarked"} {
		ns := testnet.NewNS(t)
		ip, err := m.Allocate(nil) // round-robin: a new address each time
		if err != nil {
			t.Fatal(err)
		}
		veth := VethName("sbx_" + role)
		t.Cleanup(func() { _ = m.Detach(veth) })
		if err := m.Attach(context.Background(), int(ns), ip, veth, nil); err != nil {
			t.Fatalf("attach %s: %v", role, err)
		}
		names[role] = veth
	}
	// As another server, or an older version, would have left them.
	other, _ := netlink.LinkByName(names["other"])
	if err := netlink.LinkSetAlias(other, "ramify:owner-b"); err != nil {
		t.Fatal(err)
	}
	unmarked, _ := netlink.LinkByName(names["unmarked"])
	if err := netlink.LinkSetAlias(unmarked, ""); err != nil {
		t.Fatal(err)
	}
	keep := func(v string) bool { return v == names["kept"] }
	n, err := m.Reclaim(keep)
	if err != nil || n != 1 {
		t.Fatalf("Reclaim = %d, %v; want 1 (the leftover)", n, err)
	}
	var left []string
	for role, v := range names {
		if _, err := netlink.LinkByName(v); err == nil {
			left = append(left, role)
		}
	}
	sort.Strings(left)
	if want := []string{"kept", "other", "unmarked"}; !slices.Equal(left, want) {
		t.Errorf("veths left: %v, want %v", left, want)
	}
	m.nftMu.Lock()
	_, stillPinned := m.ports[names["leftover"]]
	_, keptPinned := m.ports[names["kept"]]
	m.nftMu.Unlock()
	if stillPinned || !keptPinned {
		t.Errorf("nftables ports: leftover pinned %v, kept pinned %v", stillPinned, keptPinned)
	}
	if n, err := m.Reclaim(keep); err != nil || n != 0 {
		t.Errorf("second Reclaim = %d, %v; want 0", n, err)
	}
}

// Detach removes a port's nftables elements even when one of them is already gone: deleting them in one batch
// would fail whole (ENOENT) and leave the others in the kernel, untracked.
func TestDetachWhenAnElementIsAlreadyGone(t *testing.T) {
	m := newTestManager(t, nil)
	ns := testnet.NewNS(t)
	ip, err := m.Allocate(nil)
	if err != nil {
		t.Fatal(err)
	}
	veth := VethName("sbx_00112233445566778899aabbccddeeff")
	t.Cleanup(func() { _ = m.Detach(veth) })
	if err := m.Attach(context.Background(), int(ns), ip, veth, []string{"203.0.113.0/24"}); err != nil {
		t.Fatalf("Attach: %v", err)
	}
	c, err := nftables.New()
	if err != nil {
		t.Fatal(err)
	}
	if err := c.SetDeleteElements(m.sets.members, []nftables.SetElement{{Key: ifname(veth)}}); err != nil {
		t.Fatal(err)
	}
	if err := c.Flush(); err != nil {
		t.Fatalf("remove the members element behind the manager's back: %v", err)
	}
	if err := m.Detach(veth); err != nil {
		t.Fatalf("Detach: %v", err)
	}
	for name, s := range map[string]*nftables.Set{"pins": m.sets.pins, "custom": m.sets.custom, "any": m.sets.anyS, "members": m.sets.members} {
		if els := elementsOf(t, m, s); len(els) != 0 {
			t.Errorf("%s set after Detach: %d elements left", name, len(els))
		}
	}
}
