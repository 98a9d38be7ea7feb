package network

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os/exec"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/ramify-dev/ramify/internal/testnet"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

func TestHostNetworks(t *testing.T) {
	cidr := func(s string) *net.IPNet {
		ip, n, err := net.ParseCIDR(s)
		if err != nil {
			t.Fatal(err)
		}
		n.IP = ip // an address keeps its host part, as netlink gives it
		return n
	}
	refused := append(append([]netip.Prefix(nil), Reserved...), netip.MustParsePrefix("10.250.0.0/24"))
	addrs := []netlink.Addr{
		{IPNet: cidr("127.0.0.1/8"), Scope: unix.RT_SCOPE_HOST},        // loopback
		{IPNet: cidr("192.0.2.2/24"), Scope: unix.RT_SCOPE_UNIVERSE},   // the uplink on a public-looking range
		{IPNet: cidr("192.0.2.77/24"), Scope: unix.RT_SCOPE_UNIVERSE},  // a second address on it: once
		{IPNet: cidr("192.0.2.128/25"), Scope: unix.RT_SCOPE_UNIVERSE}, // inside the /24: left out
		{IPNet: cidr("10.250.0.1/24"), Scope: unix.RT_SCOPE_UNIVERSE},  // the server's bridge: refused anyway
		{IPNet: cidr("10.99.0.1/16"), Scope: unix.RT_SCOPE_UNIVERSE},   // a private LAN: refused anyway
		{IPNet: cidr("172.31.5.9/20"), Scope: unix.RT_SCOPE_UNIVERSE},  // a private VPC: refused anyway
		{IPNet: cidr("100.64.3.4/10"), Scope: unix.RT_SCOPE_UNIVERSE},  // shared address space: refused anyway
		{IPNet: cidr("54.12.0.10/20"), Scope: unix.RT_SCOPE_UNIVERSE},  // a VPC on a public range
		{IPNet: cidr("203.0.113.9/32"), Scope: unix.RT_SCOPE_UNIVERSE}, // a /32 (cloud style)...
		{IPNet: cidr("198.51.100.1/32"), Scope: unix.RT_SCOPE_UNIVERSE, // ...and a point-to-point link
			Peer: cidr("198.51.100.2/32")},
		{IPNet: cidr("8.8.4.4/32"), Scope: unix.RT_SCOPE_HOST}, // scope host: not a network
	}
	gws := []net.IP{
		net.ParseIP("192.0.2.1"),   // inside the uplink's prefix
		net.ParseIP("203.0.114.1"), // reached "onlink" from the /32
		net.ParseIP("172.31.1.1"),  // private: refused anyway
		net.ParseIP("2001:db8::1"), // IPv6: not ours
	}
	got := hostNetworks(addrs, gws, refused)
	want := []netip.Prefix{
		netip.MustParsePrefix("54.12.0.0/20"),
		netip.MustParsePrefix("192.0.2.0/24"),
		netip.MustParsePrefix("198.51.100.1/32"),
		netip.MustParsePrefix("198.51.100.2/32"),
		netip.MustParsePrefix("203.0.113.9/32"),
		netip.MustParsePrefix("203.0.114.1/32"),
	}
	if !slices.Equal(got, want) {
		t.Errorf("hostNetworks = %v\nwant %v", got, want)
	}
	if got := hostNetworks(nil, nil, refused); got == nil || len(got) != 0 {
		t.Errorf("no addresses: %#v, want an empty list", got)
	}
}

// TestHostNetworksRefused: a default sandbox cannot reach a machine on a network the host is directly connected
// to although it is on a public-looking range, yet reaches an internet address routed through that network's
// gateway; the rules follow the host's addresses as they come and go; an egress entry and --egress-allow open
// the network as they open private ranges.
func TestHostNetworksRefused(t *testing.T) {
	requireRoot(t)
	nets := testnet.Need(t, 2)
	for _, n := range nets {
		for _, r := range Reserved {
			if r.Overlaps(n) {
				t.Fatalf("test range %s is reserved (%s): it would not stand for a public LAN", n, r)
			}
		}
	}
	// The host's LAN (a /30 of nets[0] on a veth), with a machine on it that is also the gateway to an
	// "internet" address of nets[1].
	lan := testnet.NewPeer(t, nets[0], nets[1])
	const greeting = "hello from the host" // what dialFrom expects
	lanAddr := netip.AddrPortFrom(lan.PeerIP, uint16(lan.Listen(t, lan.PeerIP, greeting))).String()
	pubAddr := netip.AddrPortFrom(lan.Public, uint16(lan.Listen(t, lan.Public, greeting))).String()

	m := newTestManager(t, nil)
	if !slices.Contains(m.policy.hostNets, lan.Link) {
		t.Fatalf("host networks %v lack the LAN %s", m.policy.hostNets, lan.Link)
	}
	for _, n := range m.policy.hostNets {
		if n.Overlaps(netip.MustParsePrefix(testCIDR)) {
			t.Errorf("host networks %v hold the server's own subnet", m.policy.hostNets)
		}
	}
	ns := testnet.NewNS(t)
	ip, err := m.Allocate(nil)
	if err != nil {
		t.Fatal(err)
	}
	veth := VethName("sbx_1111456789abcdef0123456789abcdef")
	t.Cleanup(func() { _ = m.Detach(veth) })
	if err := m.Attach(context.Background(), int(ns), ip, veth, nil); err != nil {
		t.Fatalf("Attach: %v", err)
	}
	if err := dialFrom(ns, lanAddr); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("default sandbox to a machine on the host's LAN (%s): %v, want connection refused", lanAddr, err)
	}
	if err := dialFrom(ns, pubAddr); err != nil {
		t.Errorf("default sandbox to an internet address through the LAN's gateway (%s): %v, want reached", pubAddr, err)
	}

	// Kept current: the host leaves the network, then joins it again.
	waitHostNets := func(has bool) {
		t.Helper()
		deadline := time.Now().Add(3 * guardEvery)
		for {
			m.nftMu.Lock()
			got := slices.Contains(m.policy.hostNets, lan.Link)
			m.nftMu.Unlock()
			if got == has {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("LAN %s in the host networks: %v after %v, want %v", lan.Link, got, 3*guardEvery, has)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	if err := lan.RemoveHostAddr(); err != nil {
		t.Fatal(err)
	}
	waitHostNets(false)
	if err := lan.AddHostAddr(); err != nil {
		t.Fatal(err)
	}
	waitHostNets(true)
	if err := dialFrom(ns, lanAddr); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("after the host rejoined its LAN: %v, want connection refused", err)
	}
	if out, err := exec.Command("nft", "list", "chain", "ip", testTable, chainHostNets).CombinedOutput(); err == nil {
		if want := fmt.Sprintf("ip daddr %s jump deny", lan.Link); !strings.Contains(string(out), want) {
			t.Errorf("hostnets chain lacks %q:\n%s", want, out)
		}
	} else if !errors.Is(err, exec.ErrNotFound) {
		t.Errorf("nft list chain: %v %s", err, out)
	}

	// An egress entry naming the LAN machine opens it, and only it.
	if err := m.SetEgress(context.Background(), veth, []string{lanAddr}); err != nil {
		t.Fatal(err)
	}
	if err := dialFrom(ns, lanAddr); err != nil {
		t.Errorf("egress entry naming the LAN machine: %v, want reached", err)
	}
	if err := dialFrom(ns, pubAddr); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("egress list without the internet address: %v, want connection refused", err)
	}
	if err := m.SetEgress(context.Background(), veth, nil); err != nil {
		t.Fatal(err)
	}

	// The operator's --egress-allow naming the network opens it to default sandboxes.
	if err := m.Close(); err != nil {
		t.Fatal(err)
	}
	m2 := newTestManager(t, func(c *Config) { c.EgressAllow = []string{lan.Link.String()} })
	if !slices.Contains(m2.policy.hostNets, lan.Link) {
		t.Errorf("host networks %v lack the LAN %s (opened, yet still listed)", m2.policy.hostNets, lan.Link)
	}
	if err := dialFrom(ns, lanAddr); err != nil {
		t.Errorf("default sandbox with --egress-allow %s: %v, want reached", lan.Link, err)
	}
}

// BenchmarkCurrentHostNets is the per-second cost of reading the host's networks (two netlink dumps): ~50-70 µs
// on the build machine.
func BenchmarkCurrentHostNets(b *testing.B) {
	p := nftPolicy{}
	for b.Loop() {
		if _, err := currentHostNets(p); err != nil {
			b.Fatal(err)
		}
	}
}
