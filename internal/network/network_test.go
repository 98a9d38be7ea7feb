package network

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/ramify-dev/ramify/internal/errdefs"
	"github.com/ramify-dev/ramify/internal/testnet"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
)

const (
	testBridge = "rfytest0"
	testCIDR   = "10.250.0.0/24"
	testTable  = "ramifytest"
)

func testLogger(t *testing.T) *slog.Logger {
	return slog.New(slog.NewTextHandler(tWriter{t}, &slog.HandlerOptions{Level: slog.LevelDebug}))
}

type tWriter struct{ t *testing.T }

func (w tWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimRight(string(p), "\n"))
	return len(p), nil
}

func requireRoot(t *testing.T) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
}

// newTestManager runs New with the test bridge, CIDR and table, and removes all three (and restores ip_forward)
// when the test ends.
func newTestManager(t *testing.T, mutate func(*Config)) *Manager {
	t.Helper()
	requireRoot(t)
	cleanupHost(t)
	cfg := Config{Bridge: testBridge, CIDR: testCIDR, table: testTable}
	if mutate != nil {
		mutate(&cfg)
	}
	m, err := New(context.Background(), cfg, testLogger(t))
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() { _ = m.Close() })
	return m
}

// cleanupHost registers (once per test) removal of the test bridge and nft table and restoration of ip_forward.
func cleanupHost(t *testing.T) {
	fwd, _ := os.ReadFile(ipForwardPath)
	t.Cleanup(func() {
		if l, err := netlink.LinkByName(testBridge); err == nil {
			if err := netlink.LinkDel(l); err != nil {
				t.Errorf("cleanup bridge: %v", err)
			}
		}
		if c, err := nftables.New(); err == nil {
			for _, fam := range []nftables.TableFamily{nftables.TableFamilyIPv4, nftables.TableFamilyBridge} {
				tb := &nftables.Table{Name: testTable, Family: fam}
				c.AddTable(tb)
				c.DelTable(tb)
			}
			if err := c.Flush(); err != nil {
				t.Errorf("cleanup nft table: %v", err)
			}
		}
		if len(fwd) > 0 {
			_ = os.WriteFile(ipForwardPath, fwd, 0o644)
		}
	})
}

func TestAttachDetach(t *testing.T) {
	m := newTestManager(t, nil)
	ns := testnet.NewNS(t)
	gw := m.Gateway()
	if got := gw.String(); got != "10.250.0.1" {
		t.Fatalf("Gateway = %s", got)
	}
	if m.Prefix() != 24 {
		t.Fatalf("Prefix = %d", m.Prefix())
	}
	ip, err := m.Allocate(nil)
	if err != nil {
		t.Fatal(err)
	}
	veth := VethName("sbx_0123456789abcdef0123456789abcdef")
	t.Cleanup(func() { _ = m.Detach(veth) })
	if err := m.Attach(context.Background(), int(ns), ip, veth, nil); err != nil {
		t.Fatalf("Attach: %v", err)
	}

	checkAttached(t, m, ns, veth, ip)

	// The bridge keeps its own fixed MAC (MACFor(gateway)) however ports come and go, so the sandboxes' cached
	// gateway MAC never goes stale.
	if br, _ := netlink.LinkByName(testBridge); br.Attrs().HardwareAddr.String() != MACFor(gw).String() {
		t.Errorf("bridge MAC %s, want %s", br.Attrs().HardwareAddr, MACFor(gw))
	}

	// Attaching the same host veth again is a conflict and leaves the existing one alone.
	ns2 := testnet.NewNS(t)
	ip2, _ := m.Allocate(nil)
	if err := m.Attach(context.Background(), int(ns2), ip2, veth, nil); !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("second Attach with same veth: %v, want ErrConflict", err)
	}
	if _, err := netlink.LinkByName(veth); err != nil {
		t.Errorf("existing veth gone after conflicting Attach: %v", err)
	}

	checkDetach(t, m, ns, veth)
}

// hasEth0 reports whether namespace ns has an eth0.
func hasEth0(t *testing.T, ns netns.NsHandle) bool {
	t.Helper()
	_, _, err := nsEth0(t, ns)
	return err == nil
}

// nsEth0 returns a netlink handle working in namespace ns (closed when the test ends) and ns's eth0, or the
// error of looking it up.
func nsEth0(t *testing.T, ns netns.NsHandle) (*netlink.Handle, netlink.Link, error) {
	t.Helper()
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(h.Close)
	eth, err := h.LinkByName("eth0")
	return h, eth, err
}

// checkDetach checks that Detach removes the host veth and eth0 in the namespace, and that a second Detach is fine.
func checkDetach(t *testing.T, m *Manager, ns netns.NsHandle, veth string) {
	t.Helper()
	if err := m.Detach(veth); err != nil {
		t.Fatalf("Detach: %v", err)
	}
	if _, err := netlink.LinkByName(veth); err == nil {
		t.Errorf("host veth still present after Detach")
	}
	if hasEth0(t, ns) {
		t.Errorf("eth0 still present in netns after Detach")
	}
	if err := m.Detach(veth); err != nil {
		t.Errorf("second Detach: %v", err)
	}
}

// TestPrepareAttach: a port prepared ahead of its sandbox carries nothing until AttachPrepared gives it to the
// sandbox, which then has exactly what Attach gives; a prepared port that is gone, or one that is a sandbox's, is
// refused and left alone.
func TestPrepareAttach(t *testing.T) {
	m := newTestManager(t, func(c *Config) { c.Owner = "preparetest" })
	ns := testnet.NewNS(t)
	ctx := context.Background()
	prepared := SparePortName("fam_test/7")
	veth := VethName("sbx_00112233445566778899aabbccddeeff")
	t.Cleanup(func() { _ = m.Detach(prepared); _ = m.Detach(veth) })
	if err := m.Prepare(ctx, int(ns), prepared); err != nil {
		t.Fatalf("Prepare: %v", err)
	}

	// Prepared: the host side on the bridge, isolated, ours and down; inside, eth0 down with no address, lo up.
	host, err := netlink.LinkByName(prepared)
	if err != nil {
		t.Fatalf("prepared port: %v", err)
	}
	br, _ := netlink.LinkByName(testBridge)
	if a := host.Attrs(); a.MasterIndex != br.Attrs().Index || a.Flags&net.FlagUp != 0 || a.Alias != aliasOf("preparetest") {
		t.Errorf("prepared port: master %d (bridge %d), flags %v, alias %q", a.MasterIndex, br.Attrs().Index, a.Flags, a.Alias)
	}
	if pi, err := netlink.LinkGetProtinfo(host); err != nil || !pi.Isolated {
		t.Errorf("prepared port is not isolated (%+v, %v)", pi, err)
	}
	h, eth, err := nsEth0(t, ns)
	if err != nil {
		t.Fatalf("eth0 in netns: %v", err)
	}
	if addrs, _ := h.AddrList(eth, netlink.FAMILY_V4); eth.Attrs().Flags&net.FlagUp != 0 || len(addrs) != 0 {
		t.Errorf("prepared eth0: flags %v, addresses %v; want down, none", eth.Attrs().Flags, addrs)
	}
	if lo, err := h.LinkByName("lo"); err != nil || lo.Attrs().Flags&net.FlagUp == 0 {
		t.Errorf("lo not up in the prepared namespace (%v)", err)
	}

	// A sandbox's port (up) is not a prepared one: refused, and left as it was.
	other := testnet.NewNS(t)
	ipOther, _ := m.Allocate(nil)
	otherVeth := VethName("sbx_ffeeddccbbaa99887766554433221100")
	t.Cleanup(func() { _ = m.Detach(otherVeth) })
	if err := m.Attach(ctx, int(other), ipOther, otherVeth, nil); err != nil {
		t.Fatal(err)
	}
	ip, _ := m.Allocate(func(a net.IP) bool { return a.Equal(ipOther) })
	if err := m.AttachPrepared(ctx, int(other), otherVeth, ip, veth, nil); !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("AttachPrepared of a sandbox's port: %v, want ErrConflict", err)
	}
	checkAttached(t, m, other, otherVeth, ipOther)

	// Given to the sandbox: renamed, and exactly what Attach gives.
	if err := m.AttachPrepared(ctx, int(ns), prepared, ip, veth, nil); err != nil {
		t.Fatalf("AttachPrepared: %v", err)
	}
	if _, err := netlink.LinkByName(prepared); err == nil {
		t.Errorf("prepared port still under its spare name")
	}
	checkAttached(t, m, ns, veth, ip)
	checkDetach(t, m, ns, veth)

	// Gone: ErrNotFound, and nothing made.
	if err := m.AttachPrepared(ctx, int(ns), prepared, ip, veth, nil); !errors.Is(err, errdefs.ErrNotFound) {
		t.Errorf("AttachPrepared of a port that is gone: %v, want ErrNotFound", err)
	}
	if _, err := netlink.LinkByName(veth); err == nil {
		t.Errorf("AttachPrepared of a port that is gone made %s", veth)
	}
}

// checkAttached checks what Attach (or AttachPrepared) promises for host veth in namespace ns with address ip:
// the host side on the bridge, isolated and up; eth0 inside with MACFor(ip), ip and the default route, lo and eth0
// up; and the default egress policy, which SetEgress opens and closes port by port.
func checkAttached(t *testing.T, m *Manager, ns netns.NsHandle, veth string, ip net.IP) {
	t.Helper()
	gw := m.Gateway()
	// Host side: veth on the bridge and up.
	host, err := netlink.LinkByName(veth)
	if err != nil {
		t.Fatalf("host veth: %v", err)
	}
	br, _ := netlink.LinkByName(testBridge)
	if host.Attrs().MasterIndex != br.Attrs().Index {
		t.Errorf("veth master = %d, want bridge %d", host.Attrs().MasterIndex, br.Attrs().Index)
	}
	if host.Attrs().Flags&net.FlagUp == 0 {
		t.Errorf("host veth is not up")
	}
	if pi, err := netlink.LinkGetProtinfo(host); err != nil || !pi.Isolated {
		t.Errorf("host veth is not an isolated bridge port (%+v, %v)", pi, err)
	}

	// Inside: eth0 has the address, lo and eth0 are up, default route via the gateway.
	h, eth, err := nsEth0(t, ns)
	if err != nil {
		t.Fatalf("eth0 in netns: %v", err)
	}
	if got := eth.Attrs().HardwareAddr.String(); got != MACFor(ip).String() {
		t.Errorf("eth0 MAC %s, want %s", got, MACFor(ip))
	}
	if eth.Attrs().Flags&net.FlagUp == 0 {
		t.Errorf("eth0 is not up")
	}
	addrs, err := h.AddrList(eth, netlink.FAMILY_V4)
	if err != nil {
		t.Fatal(err)
	}
	if len(addrs) != 1 || addrs[0].IPNet.String() != ip.String()+"/24" {
		t.Errorf("eth0 addresses = %v, want %s/24", addrs, ip)
	}
	lo, err := h.LinkByName("lo")
	if err != nil || lo.Attrs().Flags&net.FlagUp == 0 {
		t.Errorf("lo not up in netns (err %v)", err)
	}
	routes, err := h.RouteList(nil, netlink.FAMILY_V4)
	if err != nil {
		t.Fatal(err)
	}
	var def *netlink.Route
	for i, r := range routes {
		if r.Dst == nil || r.Dst.String() == "0.0.0.0/0" {
			def = &routes[i]
		}
	}
	if def == nil || !def.Gw.Equal(gw) || def.LinkIndex != eth.Attrs().Index {
		t.Errorf("default route = %+v, want via %s dev eth0 (routes %v)", def, gw, routes)
	}

	// A TCP server on the gateway address (the host) is refused by default; an egress entry naming it and its
	// port opens exactly that port; [] closes it again.
	ln := listenGreeter(t, gw.String())
	other := listenGreeter(t, gw.String())
	if err := dialFrom(ns, ln.Addr().String()); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("dial the host from the netns under the default policy: %v, want connection refused", err)
	}
	if err := m.SetEgress(context.Background(), veth, []string{ln.Addr().String()}); err != nil {
		t.Fatal(err)
	}
	if err := dialFrom(ns, ln.Addr().String()); err != nil {
		t.Fatalf("dial the opened host port: %v", err)
	}
	if err := dialFrom(ns, other.Addr().String()); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("dial another host port: %v, want connection refused", err)
	}
	if err := m.SetEgress(context.Background(), veth, []string{}); err != nil {
		t.Fatal(err)
	}
	if err := dialFrom(ns, ln.Addr().String()); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("dial the host with egress []: %v, want connection refused", err)
	}

}

// listenGreeter listens on host:0 and greets every connection with one line, until the test ends.
func listenGreeter(t *testing.T, host string) net.Listener {
	t.Helper()
	ln, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			fmt.Fprintln(c, "hello from the host")
			c.Close()
		}
	}()
	return ln
}

// dialFrom connects to addr from inside ns and reads the greeting.
func dialFrom(ns netns.NsHandle, addr string) error {
	return testnet.InNS(ns, func() error {
		c, err := net.DialTimeout("tcp", addr, 10*time.Second)
		if err != nil {
			return err
		}
		defer c.Close()
		_ = c.SetDeadline(time.Now().Add(10 * time.Second))
		got, err := bufio.NewReader(c).ReadString('\n')
		if err == nil && got != "hello from the host\n" {
			err = fmt.Errorf("read %q", got)
		}
		return err
	})
}

func TestAttachFailureCleansUp(t *testing.T) {
	boom := errors.New("injected failure")
	m := newTestManager(t, func(c *Config) { c.afterCreate = func() error { return boom } })
	ns := testnet.NewNS(t)
	const veth = "rfytestfail0"
	t.Cleanup(func() { _ = m.Detach(veth) })
	err := m.Attach(context.Background(), int(ns), net.ParseIP("10.250.0.9"), veth, nil)
	if !errors.Is(err, boom) {
		t.Fatalf("Attach = %v, want injected failure", err)
	}
	if _, err := netlink.LinkByName(veth); err == nil {
		t.Errorf("host veth left behind after failed Attach")
	}
	if hasEth0(t, ns) {
		t.Errorf("eth0 left behind in netns after failed Attach")
	}

	// A namespace fd that is not a namespace: nothing is created.
	f, err := os.Open("/dev/null")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	if err := m.Attach(context.Background(), int(f.Fd()), net.ParseIP("10.250.0.9"), veth, nil); err == nil {
		t.Errorf("Attach with /dev/null as namespace succeeded")
	}
	if _, err := netlink.LinkByName(veth); err == nil {
		t.Errorf("host veth left behind after failed Attach")
	}
}

func TestAttachInvalid(t *testing.T) {
	m := newTestManager(t, nil)
	ns := testnet.NewNS(t)
	for _, tc := range []struct {
		ip, veth string
	}{
		{"10.250.0.1", "rfytestinv"},   // gateway
		{"10.250.0.0", "rfytestinv"},   // network
		{"10.250.0.255", "rfytestinv"}, // broadcast
		{"10.251.0.5", "rfytestinv"},   // outside
		{"fd00::5", "rfytestinv"},      // not IPv4
		{"10.250.0.5", ""},
		{"10.250.0.5", "much-too-long-name"},
		{"10.250.0.5", "a/b"},
	} {
		err := m.Attach(context.Background(), int(ns), net.ParseIP(tc.ip), tc.veth, nil)
		if !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("Attach(%s, %q) = %v, want ErrInvalid", tc.ip, tc.veth, err)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := m.Attach(ctx, int(ns), net.ParseIP("10.250.0.5"), "rfytestinv", nil); !errors.Is(err, context.Canceled) {
		t.Errorf("Attach with canceled ctx = %v", err)
	}
	if _, err := netlink.LinkByName("rfytestinv"); err == nil {
		t.Errorf("veth created by an invalid Attach")
	}
}

func TestNewIdempotent(t *testing.T) {
	var m *Manager
	for i := 0; i < 3; i++ {
		m = newTestManager(t, nil)
	}
	// The bridge was already up and addressed; take it down to check New brings it back up.
	br, err := netlink.LinkByName(testBridge)
	if err != nil {
		t.Fatal(err)
	}
	if err := netlink.LinkSetDown(br); err != nil {
		t.Fatal(err)
	}
	newTestManager(t, nil)

	br, err = netlink.LinkByName(testBridge)
	if err != nil {
		t.Fatal(err)
	}
	if br.Type() != "bridge" || br.Attrs().Flags&net.FlagUp == 0 {
		t.Errorf("bridge type %s flags %v", br.Type(), br.Attrs().Flags)
	}
	addrs, err := netlink.AddrList(br, netlink.FAMILY_V4)
	if err != nil {
		t.Fatal(err)
	}
	if len(addrs) != 1 || addrs[0].IPNet.String() != "10.250.0.1/24" {
		t.Errorf("bridge addresses = %v, want exactly 10.250.0.1/24", addrs)
	}
	if b, _ := os.ReadFile(ipForwardPath); strings.TrimSpace(string(b)) != "1" {
		t.Errorf("ip_forward = %q", b)
	}

	c, err := nftables.New()
	if err != nil {
		t.Fatal(err)
	}
	tables, err := c.ListTablesOfFamily(nftables.TableFamilyIPv4)
	if err != nil {
		t.Fatal(err)
	}
	var n int
	var tb *nftables.Table
	for _, x := range tables {
		if x.Name == testTable {
			n++
			tb = x
		}
	}
	if n != 1 {
		t.Fatalf("%d tables named %s, want 1", n, testTable)
	}
	chains, err := c.ListChainsOfTableFamily(nftables.TableFamilyIPv4)
	if err != nil {
		t.Fatal(err)
	}
	// forward: sandbox to sandbox, established, jump egress, one per reserved range and the CIDR, jump hostnets,
	// accept, established back, drop the rest back.
	wantRules := map[string]int{chainPostrouting: 1, chainForward: 3 + len(Reserved) + 1 + 1 + 3, chainInput: 3,
		chainEgress: 3 + 2*len(m.resolvers), chainDeny: 2, chainHostNets: len(m.policy.hostNets)}
	seen := map[string]int{}
	for _, ch := range chains {
		if ch.Table.Name != testTable {
			continue
		}
		seen[ch.Name]++
		rules, err := c.GetRules(tb, ch)
		if err != nil {
			t.Fatal(err)
		}
		if len(rules) != wantRules[ch.Name] {
			t.Errorf("chain %s has %d rules, want %d", ch.Name, len(rules), wantRules[ch.Name])
		}
	}
	if len(seen) != 6 || seen[chainDeny] != 1 || seen[chainPostrouting] != 1 || seen[chainForward] != 1 || seen[chainInput] != 1 || seen[chainEgress] != 1 || seen[chainHostNets] != 1 {
		t.Errorf("chains = %v, want one postrouting, forward, input, egress, hostnets and deny", seen)
	}

	// What the kernel made of the rules, as nft prints them (informational and a sanity check of the encoding).
	if out, err := exec.Command("sh", "-c", "nft list table ip "+testTable+" && nft list table bridge "+testTable).CombinedOutput(); err == nil {
		s := string(out)
		t.Logf("nft list table ip %s:\n%s", testTable, s)
		for _, want := range []string{
			`ip saddr 10.250.0.0/24 oifname != "rfytest0"`, "masquerade",
			`iifname "rfytest0"`, `oifname "rfytest0" ct state established,related`,
			"hook postrouting priority srcnat", "hook forward priority filter", "hook input priority filter",
			`ip daddr 10.0.0.0/8`, `ip saddr . ip daddr @eg_any accept`,
			`ip saddr . ip daddr . meta l4proto . th dport @eg_port accept`, `ip saddr @custom jump deny`, `reject with tcp reset`,
			`iifname != @members accept`, `iifname . ether saddr . ip saddr @pins accept`,
			`iifname . arp saddr ether . arp saddr ip @pins`, `iifname "rfytest0" jump hostnets`,
		} {
			if !strings.Contains(s, want) {
				t.Errorf("nft listing lacks %q", want)
			}
		}
	} else if !errors.Is(err, exec.ErrNotFound) {
		t.Logf("nft list: %v: %s", err, out)
	}
}

func TestNewRejectsNonBridge(t *testing.T) {
	requireRoot(t)
	cleanupHost(t)
	// A veth (not a bridge) with the bridge's name.
	if err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: testBridge}, PeerName: "rfytest0peer"}); err != nil {
		t.Fatal(err)
	}
	_, err := New(context.Background(), Config{Bridge: testBridge, CIDR: testCIDR, table: testTable}, nil)
	if !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("New over a veth = %v, want ErrConflict", err)
	}
}

func TestNewInvalidConfig(t *testing.T) {
	for _, cfg := range []Config{
		{CIDR: "10.0.0.0/31"},
		{CIDR: "10.0.0.1/32"},
		{CIDR: "0.0.0.0/0"},
		{CIDR: "fd00::/64"},
		{CIDR: "nonsense"},
		{Bridge: "this-name-is-too-long"},
	} {
		if _, err := New(context.Background(), cfg, nil); !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("New(%+v) = %v, want ErrInvalid", cfg, err)
		}
	}
}

func TestVethName(t *testing.T) {
	for _, tc := range []struct{ id, want string }{
		{"sbx_0123456789abcdef0123456789abcdef", "rfy0123456789ab"},
		{"sbx_ABCDEF0123456789", "rfyabcdef012345"},
		{"0123456789abcdef", "rfy0123456789ab"},
	} {
		if got := VethName(tc.id); got != tc.want {
			t.Errorf("VethName(%q) = %q, want %q", tc.id, got, tc.want)
		}
	}
	// Non-hex or short ids are hashed; distinct ids give distinct names.
	a, b := VethName("sbx_short"), VethName("sbx_shorter")
	if a == b || len(a) != 15 || !strings.HasPrefix(a, "rfy") || !isHex(a[3:]) {
		t.Errorf("hashed names %q %q", a, b)
	}
	if VethName("sbx_short") != a {
		t.Errorf("VethName not deterministic")
	}
}

func FuzzVethName(f *testing.F) {
	for _, s := range []string{"", "_", "sbx_", "sbx_0123456789abcdef0123456789abcdef", "ünïcödé", "a/b"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, id string) {
		n := VethName(id)
		if len(n) != 15 || !strings.HasPrefix(n, "rfy") || !isHex(n[3:]) || validIfName(n) != nil {
			t.Fatalf("VethName(%q) = %q", id, n)
		}
		if VethName(id) != n {
			t.Fatalf("not deterministic")
		}
	})
}

func TestAllocateTable(t *testing.T) {
	type step struct {
		used []string // addresses in use for this call
		want string   // "" = exhausted
	}
	for _, tc := range []struct {
		cidr  string
		steps []step
	}{
		{"10.0.0.0/30", []step{
			{nil, "10.0.0.2"},
			{nil, "10.0.0.2"}, // the only host address, reused once free
			{[]string{"10.0.0.2"}, ""},
		}},
		{"10.0.0.4/30", []step{{nil, "10.0.0.6"}}},
		{"192.168.7.77/29", []step{ // non-aligned address: the network is .72
			{nil, "192.168.7.74"}, {nil, "192.168.7.75"}, {nil, "192.168.7.76"}, {nil, "192.168.7.77"},
			{nil, "192.168.7.78"}, {nil, "192.168.7.74"}, // wraps, never .79 (broadcast) or .73 (gateway)
			{[]string{"192.168.7.75", "192.168.7.76"}, "192.168.7.77"},
		}},
		{"10.250.0.0/24", []step{
			{nil, "10.250.0.2"},
			{[]string{"10.250.0.3", "10.250.0.4"}, "10.250.0.5"},
			{nil, "10.250.0.6"},
		}},
		{"10.213.0.0/16", []step{
			{nil, "10.213.0.2"},
			{[]string{"10.213.0.3"}, "10.213.0.4"},
		}},
	} {
		t.Run(tc.cidr, func(t *testing.T) {
			p, err := newPool(tc.cidr)
			if err != nil {
				t.Fatal(err)
			}
			m := &Manager{pool: p}
			for i, s := range tc.steps {
				used := map[string]bool{}
				for _, u := range s.used {
					used[u] = true
				}
				ip, err := m.Allocate(func(ip net.IP) bool { return used[ip.String()] })
				switch {
				case s.want == "" && !errors.Is(err, errdefs.ErrConflict):
					t.Fatalf("step %d: got %v, %v; want exhausted", i, ip, err)
				case s.want == "":
					if !strings.Contains(err.Error(), "address pool exhausted") {
						t.Errorf("error text %q", err)
					}
				case err != nil || ip.String() != s.want:
					t.Fatalf("step %d: got %v, %v; want %s", i, ip, err, s.want)
				}
			}
		})
	}
}

func TestAllocateExhaust16(t *testing.T) {
	p, err := newPool("10.213.0.0/16")
	if err != nil {
		t.Fatal(err)
	}
	m := &Manager{pool: p}
	used := map[string]bool{}
	for i := 0; i < 65536-3; i++ {
		ip, err := m.Allocate(func(ip net.IP) bool { return used[ip.String()] })
		if err != nil {
			t.Fatalf("allocation %d: %v", i, err)
		}
		if used[ip.String()] {
			t.Fatalf("allocation %d: %s handed out twice", i, ip)
		}
		used[ip.String()] = true
	}
	for _, bad := range []string{"10.213.0.0", "10.213.0.1", "10.213.255.255"} {
		if used[bad] {
			t.Errorf("%s was allocated", bad)
		}
	}
	if _, err := m.Allocate(func(ip net.IP) bool { return used[ip.String()] }); !errors.Is(err, errdefs.ErrConflict) {
		t.Errorf("full /16: %v", err)
	}
}

// FuzzAllocate checks Allocate's invariants over arbitrary IPv4 networks with prefixes /16 to /30 and arbitrary
// in-use sets: the result is a host address of the network, not the gateway, not in use; exhaustion is reported
// (as ErrConflict) exactly when every assignable address is in use.
func FuzzAllocate(f *testing.F) {
	f.Add(uint32(0x0afa0000), uint8(24), uint64(0), uint8(0), uint8(3))
	f.Add(uint32(0x0a000000), uint8(30), uint64(1), uint8(255), uint8(2))
	f.Add(uint32(0x0ad50000), uint8(16), uint64(7), uint8(128), uint8(5))
	f.Add(uint32(0xc0a8074d), uint8(29), uint64(9), uint8(200), uint8(9))
	f.Add(uint32(0xffffffff), uint8(30), uint64(3), uint8(0), uint8(4))
	f.Fuzz(func(t *testing.T, addr uint32, prefix uint8, seed uint64, density uint8, calls uint8) {
		prefix = 16 + prefix%15 // 16..30
		cidr := fmt.Sprintf("%s/%d", u32ToIP(addr), prefix)
		p, err := newPool(cidr)
		if err != nil {
			t.Fatalf("newPool(%s): %v", cidr, err)
		}
		m := &Manager{pool: p}
		gw, bc := p.gateway(), p.broadcast()
		if !p.network.Contains(gw) || !p.network.Contains(bc) || gw.Equal(bc) {
			t.Fatalf("%s: gateway %s broadcast %s", cidr, gw, bc)
		}
		// density 255 means "everything in use".
		inUse := func(ip net.IP) bool {
			if density == 255 {
				return true
			}
			h := (uint64(binaryIP(ip)) ^ seed) * 0x9e3779b97f4a7c15
			return uint8(h>>56) < density
		}
		for i := 0; i < int(calls%8)+1; i++ {
			ip, err := m.Allocate(inUse)
			if err != nil {
				if !errors.Is(err, errdefs.ErrConflict) {
					t.Fatalf("%s: error %v is not ErrConflict", cidr, err)
				}
				// Verify exhaustion is real.
				for off := uint64(2); off < p.size-1; off++ {
					if cand := u32ToIP(p.base + uint32(off)); !inUse(cand) {
						t.Fatalf("%s: exhausted but %s is free", cidr, cand)
					}
				}
				return
			}
			if !p.network.Contains(ip) || !p.isHost(ip) || ip.Equal(gw) || ip.Equal(bc) || inUse(ip) {
				t.Fatalf("%s: allocated %s (gateway %s, broadcast %s, in use %v)", cidr, ip, gw, bc, inUse(ip))
			}
			if len(ip) != 4 {
				t.Fatalf("%s: allocated %d-byte IP", cidr, len(ip))
			}
		}
	})
}

func binaryIP(ip net.IP) uint32 {
	b := ip.To4()
	return uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
}

// Tables another program removed (`nft flush ruleset`, as `systemctl restart nftables` does on Debian) are put
// back within a guard period or two, with every port's pin and egress policy: before, the sandboxes lost their
// isolation for good (the host and each other reachable, no spoofing check) and new ports failed.
func TestTablesRemovedAreRestored(t *testing.T) {
	m := newTestManager(t, nil)
	ns := testnet.NewNS(t)
	ip, err := m.Allocate(nil)
	if err != nil {
		t.Fatal(err)
	}
	veth := VethName("sbx_0123456789abcdef0123456789abcdee")
	t.Cleanup(func() { _ = m.Detach(veth) })
	if err := m.Attach(context.Background(), int(ns), ip, veth, nil); err != nil {
		t.Fatalf("Attach: %v", err)
	}
	ln := listenGreeter(t, m.Gateway().String())
	if err := dialFrom(ns, ln.Addr().String()); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("dial the host under the default policy: %v, want connection refused", err)
	}
	for _, family := range []string{"ip", "bridge"} {
		if out, err := exec.Command("nft", "delete", "table", family, testTable).CombinedOutput(); err != nil {
			t.Fatalf("nft delete table %s %s: %v %s", family, testTable, err, out)
		}
	}
	if err := dialFrom(ns, ln.Addr().String()); err != nil {
		t.Logf("dial the host right after the tables went: %v (the guard was quicker)", err)
	}
	deadline := time.Now().Add(3 * guardEvery)
	for {
		m.nftMu.Lock()
		intact := m.tablesIntact()
		m.nftMu.Unlock()
		if intact {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the tables were not restored within %v", 3*guardEvery)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err := dialFrom(ns, ln.Addr().String()); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("dial the host once the tables are back: %v, want connection refused", err)
	}
	m.nftMu.Lock()
	pins, err := m.nft.GetSetElements(m.sets.pins)
	m.nftMu.Unlock()
	if err != nil || len(pins) != 1 {
		t.Errorf("pins after the restore: %d, %v; want the port's", len(pins), err)
	}
	// New policies and ports work again.
	if err := m.SetEgress(context.Background(), veth, []string{ln.Addr().String()}); err != nil {
		t.Fatalf("SetEgress after the restore: %v", err)
	}
	if err := dialFrom(ns, ln.Addr().String()); err != nil {
		t.Errorf("dial the opened host port after the restore: %v", err)
	}
}
