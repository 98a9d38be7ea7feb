// Package testnet gives tests network peers of their own on the host: a network namespace joined to the host by a
// veth pair, on documentation addresses (RFC 5737) that no real network of the host uses, so that a test never
// sends anything to the host's real LAN or to the internet. The build machines' own uplink is on one of those
// ranges, and another host's may be too: FreeNets says which ones are free here.
package testnet

import (
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// vethPrefix starts the host side of every peer's veth pair; links with it are the tests' own (FreeNets ignores
// them: tests running at the same time share the free ranges, one /30 slot each).
const vethPrefix = "rfytn"

// slots is how many peers fit in a /24: one /30 each.
const slots = 64

// Candidates are the ranges FreeNets chooses from: TEST-NET-1, -2 and -3 (RFC 5737), routed nowhere on the
// internet and not among the ranges ramify refuses as private or reserved.
var Candidates = []netip.Prefix{
	netip.MustParsePrefix("192.0.2.0/24"),
	netip.MustParsePrefix("198.51.100.0/24"),
	netip.MustParsePrefix("203.0.113.0/24"),
}

// FreeNets returns the Candidates that no address or route of the host overlaps (the default route aside, and
// the tests' own peers aside), in Candidates' order.
func FreeNets() ([]netip.Prefix, error) {
	links, err := netlink.LinkList()
	if err != nil {
		return nil, err
	}
	own := map[int]bool{}
	for _, l := range links {
		if strings.HasPrefix(l.Attrs().Name, vethPrefix) {
			own[l.Attrs().Index] = true
		}
	}
	var used []netip.Prefix
	note := func(n *net.IPNet, link int) {
		if n == nil || own[link] {
			return
		}
		a, ok := netip.AddrFromSlice(n.IP.To4())
		ones, bits := n.Mask.Size()
		if !ok || bits != 32 || ones == 0 {
			return
		}
		used = append(used, netip.PrefixFrom(a, ones).Masked())
	}
	addrs, err := netlink.AddrList(nil, netlink.FAMILY_V4)
	if err != nil && !errors.Is(err, netlink.ErrDumpInterrupted) {
		return nil, err
	}
	for _, a := range addrs {
		note(a.IPNet, a.LinkIndex)
		note(a.Peer, a.LinkIndex)
	}
	routes, err := netlink.RouteListFiltered(netlink.FAMILY_V4, &netlink.Route{Table: unix.RT_TABLE_UNSPEC}, netlink.RT_FILTER_TABLE)
	if err != nil && !errors.Is(err, netlink.ErrDumpInterrupted) {
		return nil, err
	}
	for _, r := range routes {
		note(r.Dst, r.LinkIndex)
		if r.Gw != nil && !own[r.LinkIndex] {
			note(&net.IPNet{IP: r.Gw, Mask: net.CIDRMask(32, 32)}, r.LinkIndex)
		}
	}
	var out []netip.Prefix
	for _, c := range Candidates {
		free := true
		for _, u := range used {
			if u.Overlaps(c) {
				free = false
				break
			}
		}
		if free {
			out = append(out, c)
		}
	}
	return out, nil
}

// Need returns n free ranges, or skips the test when this host uses too many of the Candidates.
func Need(t testing.TB, n int) []netip.Prefix {
	t.Helper()
	free, err := FreeNets()
	if err != nil {
		t.Fatalf("testnet: %v", err)
	}
	if len(free) < n {
		t.Skipf("testnet: this host's own networks overlap the documentation ranges; free: %v, need %d", free, n)
	}
	return free[:n]
}

// Peer is a network namespace joined to the host by a veth pair on a /30 of a test range: the host side (Veth)
// has HostIP, the namespace's eth0 has PeerIP. Public, when the peer was made with a public range, is an address
// of that range on the namespace's loopback that the host routes via PeerIP: an internet host behind a gateway on
// the host's LAN.
type Peer struct {
	NS             netns.NsHandle
	Veth           string
	Link           netip.Prefix
	HostIP, PeerIP netip.Addr
	Public         netip.Addr
}

// NewPeer makes a peer on a free /30 of lan, with a Public address of public unless public is the zero Prefix.
// Everything it makes (namespace, veth pair, addresses, route) is removed when the test ends, and goes with the
// namespace when the test process dies.
func NewPeer(t testing.TB, lan, public netip.Prefix) *Peer {
	t.Helper()
	ns := NewNS(t)
	var p *Peer
	start := os.Getpid() % slots
	for i := range slots {
		slot := (start + i) % slots
		veth := fmt.Sprintf("%s%d", vethPrefix, slot)
		err := netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: veth}, PeerName: "eth0", PeerNamespace: netlink.NsFd(int(ns))})
		if errors.Is(err, unix.EEXIST) {
			continue // another test's peer
		}
		if err != nil {
			t.Fatalf("testnet: create veth %s: %v", veth, err)
		}
		t.Cleanup(func() {
			if l, err := netlink.LinkByName(veth); err == nil {
				netlink.LinkDel(l) //nolint:errcheck // goes with the namespace anyway
			}
		})
		base := lan.Masked().Addr().As4()
		base[3] += byte(4 * slot)
		link := netip.PrefixFrom(netip.AddrFrom4(base), 30)
		p = &Peer{NS: ns, Veth: veth, Link: link, HostIP: link.Addr().Next(), PeerIP: link.Addr().Next().Next()}
		if public.IsValid() {
			pb := public.Masked().Addr().As4()
			pb[3] += byte(4*slot + 1)
			p.Public = netip.AddrFrom4(pb)
		}
		break
	}
	if p == nil {
		t.Fatalf("testnet: all %d peer slots are taken", slots)
	}
	host, err := netlink.LinkByName(p.Veth)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.AddHostAddr(); err != nil {
		t.Fatal(err)
	}
	if err := netlink.LinkSetUp(host); err != nil {
		t.Fatal(err)
	}
	h, err := netlink.NewHandleAt(ns)
	if err != nil {
		t.Fatal(err)
	}
	defer h.Close()
	for _, name := range []string{"lo", "eth0"} {
		l, err := h.LinkByName(name)
		if err != nil {
			t.Fatal(err)
		}
		var a netip.Prefix
		switch {
		case name == "eth0":
			a = netip.PrefixFrom(p.PeerIP, 30)
		case p.Public.IsValid():
			a = netip.PrefixFrom(p.Public, 32)
		}
		if a.IsValid() {
			if err := h.AddrAdd(l, &netlink.Addr{IPNet: ipnet(a)}); err != nil {
				t.Fatalf("testnet: address %s on %s: %v", a, name, err)
			}
		}
		if err := h.LinkSetUp(l); err != nil {
			t.Fatal(err)
		}
	}
	if p.Public.IsValid() {
		// Inside: the way back to anything (a masqueraded sandbox comes from HostIP, on-link). Outside: the
		// public address via the peer, as the internet is reached via a gateway.
		eth0, _ := h.LinkByName("eth0")
		if err := h.RouteAdd(&netlink.Route{LinkIndex: eth0.Attrs().Index, Gw: p.HostIP.AsSlice()}); err != nil {
			t.Fatalf("testnet: default route in the peer: %v", err)
		}
		if err := netlink.RouteAdd(&netlink.Route{LinkIndex: host.Attrs().Index, Dst: ipnet(netip.PrefixFrom(p.Public, 32)), Gw: p.PeerIP.AsSlice()}); err != nil {
			t.Fatalf("testnet: route to %s: %v", p.Public, err)
		}
	}
	return p
}

// RemoveHostAddr takes HostIP off the host's veth (the host is no longer on the peer's network; the peer's route
// goes with it).
func (p *Peer) RemoveHostAddr() error {
	l, err := netlink.LinkByName(p.Veth)
	if err != nil {
		return err
	}
	return netlink.AddrDel(l, &netlink.Addr{IPNet: ipnet(netip.PrefixFrom(p.HostIP, 30))})
}

// AddHostAddr puts HostIP back on the host's veth.
func (p *Peer) AddHostAddr() error {
	l, err := netlink.LinkByName(p.Veth)
	if err != nil {
		return err
	}
	return netlink.AddrAdd(l, &netlink.Addr{IPNet: ipnet(netip.PrefixFrom(p.HostIP, 30))})
}

// Listen starts a listener on addr:0 inside the peer's namespace that greets each connection with greeting and a
// newline, and returns its port once the host itself reaches it (a new link's first packets can be lost). It is
// closed when the test ends.
func (p *Peer) Listen(t testing.TB, addr netip.Addr, greeting string) int {
	t.Helper()
	var ln net.Listener
	err := InNS(p.NS, func() (err error) {
		ln, err = net.Listen("tcp", netip.AddrPortFrom(addr, 0).String())
		return err
	})
	if err != nil {
		t.Fatalf("testnet: listen on %s in the peer: %v", addr, err)
	}
	t.Cleanup(func() { ln.Close() })
	Greet(ln, greeting)
	a := ln.Addr().String()
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(50 * time.Millisecond) {
		c, err := net.DialTimeout("tcp", a, time.Second)
		if err == nil {
			c.Close()
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("testnet: %s in the peer is not reachable from the host: %v", a, err)
		}
	}
	return ln.Addr().(*net.TCPAddr).Port
}

// Greet answers every connection ln accepts with the line greeting, until ln is closed.
func Greet(ln net.Listener, greeting string) {
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			fmt.Fprintln(c, greeting)
			c.Close()
		}
	}()
}

func ipnet(p netip.Prefix) *net.IPNet {
	return &net.IPNet{IP: p.Addr().AsSlice(), Mask: net.CIDRMask(p.Bits(), 32)}
}

// NewNS creates a network namespace with no process in it; it is gone when the handle is closed (the test's end)
// and the sockets in it are closed.
func NewNS(t testing.TB) netns.NsHandle {
	t.Helper()
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	orig, err := netns.Get()
	if err != nil {
		t.Fatal(err)
	}
	defer orig.Close()
	ns, err := netns.New() // switches this thread into it
	if err != nil {
		t.Fatal(err)
	}
	if err := netns.Set(orig); err != nil {
		panic(err) // this thread must not go back to the pool in the wrong namespace
	}
	t.Cleanup(func() { ns.Close() })
	return ns
}

// InNS runs f on a thread inside ns (a thread that cannot go back to its namespace is thrown away).
func InNS(ns netns.NsHandle, f func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		orig, err := netns.Get()
		if err != nil {
			errc <- err
			return
		}
		defer orig.Close()
		if err := netns.Set(ns); err != nil {
			errc <- err
			return
		}
		ferr := f()
		if err := netns.Set(orig); err != nil {
			errc <- errors.Join(ferr, err)
			return // the thread stays locked and is thrown away
		}
		runtime.UnlockOSThread()
		errc <- ferr
	}()
	return <-errc
}
