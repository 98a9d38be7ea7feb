package network

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/google/nftables"
	"github.com/ramify-dev/ramify/internal/errdefs"
	"github.com/ramify-dev/ramify/internal/testnet"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

func TestParseEgressEntry(t *testing.T) {
	for _, tc := range []struct {
		in   string
		want EgressRule
		err  string // substring of the error; "" = valid
	}{
		{in: "10.0.0.0/8", want: EgressRule{Net: netip.MustParsePrefix("10.0.0.0/8")}},
		{in: "10.1.2.3/8", want: EgressRule{Net: netip.MustParsePrefix("10.0.0.0/8")}},
		{in: "0.0.0.0/0", want: EgressRule{Net: netip.MustParsePrefix("0.0.0.0/0")}},
		{in: "10.213.0.1", want: EgressRule{Net: netip.MustParsePrefix("10.213.0.1/32")}},
		{in: "10.213.0.1:8080", want: EgressRule{Net: netip.MustParsePrefix("10.213.0.1/32"), Port: 8080}},
		{in: "192.168.0.0/16:443", want: EgressRule{Net: netip.MustParsePrefix("192.168.0.0/16"), Port: 443}},
		{in: "example.com", want: EgressRule{Host: "example.com"}},
		{in: "API.Example.COM.:443", want: EgressRule{Host: "api.example.com", Port: 443}},
		{in: "pypi", want: EgressRule{Host: "pypi"}},
		{in: "x-1.y2.io:65535", want: EgressRule{Host: "x-1.y2.io", Port: 65535}},
		{in: "", err: "empty"},
		{in: ":80", err: "missing address"},
		{in: "10.0.0.0/33", err: "CIDR"},
		{in: "10.0.0.0/", err: "CIDR"},
		{in: "::1", err: "IPv6"},
		{in: "[::1]:80", err: "IPv6"},
		{in: "fe80::/10", err: "IPv6"},
		{in: "2001:db8::1", err: "IPv6"},
		{in: "1.2.3", err: "IPv4 address"},
		{in: "300.1.1.1", err: "IPv4 address"},
		{in: "01.2.3.4", err: "IPv4 address"},
		{in: "1.2.3.4:0", err: "port"},
		{in: "1.2.3.4:65536", err: "port"},
		{in: "1.2.3.4:+80", err: "port"},
		{in: "1.2.3.4:", err: "port"},
		{in: "1.2.3.4:80:", err: "IPv6"},
		{in: "host:http", err: "port"},
		{in: "a..b", err: "hostname"},
		{in: "-a.com", err: "hostname"},
		{in: "a-.com", err: "hostname"},
		{in: "a_b.com", err: "invalid character"},
		{in: "a b", err: "invalid character"},
		{in: "*.example.com", err: "invalid character"},
		{in: "example.123", err: "hostname"},
		{in: strings.Repeat("a", 64) + ".com", err: "hostname"},
		{in: strings.Repeat("a.", 127) + "com", err: "hostname"},
		{in: "10.0.0.0/8/8", err: "CIDR"},
		{in: "http://example.com", err: "port"},
	} {
		got, err := ParseEgressEntry(tc.in)
		switch {
		case tc.err == "" && err != nil:
			t.Errorf("%q: %v", tc.in, err)
		case tc.err == "" && got != tc.want:
			t.Errorf("%q = %+v, want %+v", tc.in, got, tc.want)
		case tc.err != "" && (err == nil || !strings.Contains(err.Error(), tc.err)):
			t.Errorf("%q: error %v, want one containing %q", tc.in, err, tc.err)
		}
	}
}

func TestParseEgress(t *testing.T) {
	if r, err := ParseEgress(nil); r != nil || err != nil {
		t.Errorf("nil = %v %v, want nil (the default policy)", r, err)
	}
	if r, err := ParseEgress([]string{}); r == nil || len(r) != 0 || err != nil {
		t.Errorf("[] = %#v %v, want an empty non-nil list", r, err)
	}
	_, err := ParseEgress([]string{"1.1.1.1", "bad host!"})
	if !errors.Is(err, errdefs.ErrInvalid) || !strings.Contains(err.Error(), `egress[1] "bad host!"`) {
		t.Errorf("error %v, want ErrInvalid naming egress[1]", err)
	}
	if _, err := ParseEgress(make([]string, MaxEgressEntries+1)); !errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("too many entries: %v", err)
	}
}

// FuzzParseEgressEntry: the parser never panics, and what it accepts is well-formed.
func FuzzParseEgressEntry(f *testing.F) {
	for _, s := range []string{"10.0.0.0/8", "1.2.3.4:80", "example.com:443", "::1", "a..b", "", ":", "0/0",
		"1.2.3.4/32:65535", "x.y.z.", "[::]:1"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		r, err := ParseEgressEntry(s)
		if err != nil {
			return
		}
		if r.Host == "" {
			if !r.Net.IsValid() || !r.Net.Addr().Is4() || r.Net != r.Net.Masked() {
				t.Fatalf("%q: bad network %v", s, r.Net)
			}
		} else {
			if r.Net.IsValid() || len(r.Host) > 253 || strings.ToLower(r.Host) != r.Host || strings.HasSuffix(r.Host, ".") {
				t.Fatalf("%q: bad host %+v", s, r)
			}
		}
		if strings.Contains(s, ":") != (r.Port != 0) {
			t.Fatalf("%q: port %d", s, r.Port)
		}
		p := plan([]EgressRule{r}, func(string) []netip.Addr { return []netip.Addr{netip.MustParseAddr("192.0.2.1")} }, nil)
		if !p.custom {
			t.Fatalf("%q: plan not custom", s)
		}
	})
}

func TestMergeRanges(t *testing.T) {
	got := mergeRanges([]ipRange{{10, 20}, {21, 30}, {5, 12}, {40, 50}, {45, 46}, {^uint32(0) - 1, ^uint32(0)}, {^uint32(0), ^uint32(0)}})
	want := []ipRange{{5, 30}, {40, 50}, {^uint32(0) - 1, ^uint32(0)}}
	if len(got) != len(want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Fatalf("got %v, want %v", got, want)
		}
	}
}

func TestPlan(t *testing.T) {
	rules, err := ParseEgress([]string{"10.0.0.0/8", "10.1.2.3", "192.0.2.7:443", "192.0.2.0/24:443", "db.internal:5432"})
	if err != nil {
		t.Fatal(err)
	}
	res := netip.MustParseAddr("10.255.255.53")
	p := plan(rules, func(h string) []netip.Addr {
		return []netip.Addr{netip.MustParseAddr("10.9.9.9"), netip.MustParseAddr("10.9.9.10")}
	}, []netip.Addr{res})
	if !p.custom || len(p.any) != 1 || p.any[0] != prefixRange(netip.MustParsePrefix("10.0.0.0/8")) {
		t.Errorf("any = %v", p.any)
	}
	if r := p.ports[443]; len(r) != 1 || r[0] != prefixRange(netip.MustParsePrefix("192.0.2.0/24")) {
		t.Errorf("443 = %v", r)
	}
	if r := p.ports[5432]; len(r) != 1 || r[0] != (ipRange{addrU32(netip.MustParseAddr("10.9.9.9")), addrU32(netip.MustParseAddr("10.9.9.10"))}) {
		t.Errorf("5432 = %v", r)
	}
	if r := p.ports[53]; len(r) != 1 || r[0].lo != addrU32(res) {
		t.Errorf("a list with a hostname should open the resolvers on port 53: %v", r)
	}
	if p := plan([]EgressRule{}, nil, []netip.Addr{res}); !p.custom || len(p.any) != 0 || len(p.ports) != 0 {
		t.Errorf("[] = %+v, want custom and nothing open (not even DNS)", p)
	}
	if p := plan(nil, nil, nil); p.custom {
		t.Errorf("nil = %+v, want the default policy", p)
	}
}

func TestHostResolvers(t *testing.T) {
	f := t.TempDir() + "/resolv.conf"
	if err := os.WriteFile(f, []byte("# c\nnameserver 10.255.255.53\nnameserver 127.0.0.53\nnameserver ::1\nnameserver 1.1.1.1\nsearch x\nnameserver 10.255.255.53\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	got := hostResolvers(f)
	if len(got) != 2 || got[0].String() != "10.255.255.53" || got[1].String() != "1.1.1.1" {
		t.Errorf("got %v", got)
	}
	if got := hostResolvers(f + ".missing"); got == nil || len(got) != 0 {
		t.Errorf("missing file: %#v, want empty non-nil", got)
	}
	g := t.TempDir() + "/image-resolv.conf"
	if err := os.WriteFile(g, []byte("nameserver 1.1.1.1\nnameserver 9.9.9.9\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	if got := ResolversFrom(f, f+".missing", g); len(got) != 3 || got[2].String() != "9.9.9.9" {
		t.Errorf("ResolversFrom = %v, want the union in order", got)
	}
}

// elementsOf reads a set's elements from the kernel, as keys.
func elementsOf(t *testing.T, m *Manager, s *nftables.Set) map[string]bool {
	t.Helper()
	c, err := nftables.New()
	if err != nil {
		t.Fatal(err)
	}
	els, err := c.GetSetElements(s)
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]bool{}
	for _, e := range els {
		out[elemKey(nftables.SetElement{Key: e.Key, KeyEnd: e.KeyEnd})] = true
	}
	return out
}

// TestEgressHostnamesKeptCurrent: a hostname entry becomes the addresses the server resolves, and they are
// updated when the name's addresses change; Detach removes every element; a restart of the manager keeps a live
// port's elements.
func TestEgressHostnamesKeptCurrent(t *testing.T) {
	var mu sync.Mutex
	addrs := map[string][]netip.Addr{"db.example": {netip.MustParseAddr("192.0.2.10")}}
	lookup := func(ctx context.Context, h string) ([]netip.Addr, error) {
		mu.Lock()
		defer mu.Unlock()
		if a, ok := addrs[h]; ok {
			return a, nil
		}
		return nil, errors.New("no such host")
	}
	res := []netip.Addr{netip.MustParseAddr("192.0.2.53")}
	m := newTestManager(t, func(c *Config) { c.lookup = lookup; c.Resolvers = res; c.ResolveEvery = time.Hour })
	ns := testnet.NewNS(t)
	ip, _ := m.Allocate(nil)
	src := netip.MustParseAddr(ip.String())
	veth := VethName("sbx_feedfacefeedfacefeedfacefeedface")
	t.Cleanup(func() { _ = m.Detach(veth) })
	if err := m.Attach(context.Background(), int(ns), ip, veth, []string{"db.example:5432"}); err != nil {
		t.Fatal(err)
	}
	r10 := ipRange{addrU32(netip.MustParseAddr("192.0.2.10")), addrU32(netip.MustParseAddr("192.0.2.10"))}
	r53 := ipRange{addrU32(res[0]), addrU32(res[0])}
	want := func(rs map[uint16][]ipRange) map[string]bool {
		out := map[string]bool{}
		for port, rr := range rs {
			for _, r := range rr {
				out[elemKey(portElem(src, r, 6, port))] = true
				out[elemKey(portElem(src, r, 17, port))] = true
			}
		}
		return out
	}
	check := func(what string, w map[string]bool) {
		t.Helper()
		got := elementsOf(t, m, m.sets.port)
		if len(got) != len(w) {
			t.Errorf("%s: %d port elements, want %d", what, len(got), len(w))
		}
		for k := range w {
			if !got[k] {
				t.Errorf("%s: element missing", what)
			}
		}
	}
	check("attached", want(map[uint16][]ipRange{5432: {r10}, 53: {r53}}))
	if c := elementsOf(t, m, m.sets.custom); len(c) != 1 {
		t.Errorf("custom set: %d elements, want 1", len(c))
	}

	mu.Lock()
	addrs["db.example"] = []netip.Addr{netip.MustParseAddr("192.0.2.20"), netip.MustParseAddr("192.0.2.21")}
	mu.Unlock()
	m.refresh()
	r20 := ipRange{addrU32(netip.MustParseAddr("192.0.2.20")), addrU32(netip.MustParseAddr("192.0.2.21"))}
	check("re-resolved", want(map[uint16][]ipRange{5432: {r20}, 53: {r53}}))

	// A failed lookup keeps the last known addresses.
	mu.Lock()
	delete(addrs, "db.example")
	mu.Unlock()
	m.refresh()
	check("lookup failed", want(map[uint16][]ipRange{5432: {r20}, 53: {r53}}))

	// A new manager (a server restart) keeps the live port's pin and policy.
	m.Close()
	m2 := newTestManager(t, func(c *Config) { c.lookup = lookup; c.Resolvers = res; c.ResolveEvery = time.Hour })
	m = m2
	check("after a restart", want(map[uint16][]ipRange{5432: {r20}, 53: {r53}}))
	if p := elementsOf(t, m, m.sets.pins); len(p) != 1 {
		t.Errorf("pins after a restart: %d, want 1", len(p))
	}

	if err := m.Detach(veth); err != nil {
		t.Fatal(err)
	}
	for _, s := range []*nftables.Set{m.sets.pins, m.sets.members, m.sets.custom, m.sets.anyS, m.sets.port} {
		if n := len(elementsOf(t, m, s)); n != 0 {
			t.Errorf("set %s has %d elements after Detach", s.Name, n)
		}
	}
}

// BenchmarkPortElements measures what the policy adds to Attach and Detach: one nftables batch each (pin,
// membership and policy elements in, then out), with a default and with a three-entry egress list. Detach's
// background conntrack clean-up is waited for between rounds, outside the timings.
func BenchmarkPortElements(b *testing.B) {
	for _, tc := range []struct {
		name   string
		egress []string
	}{{"default", nil}, {"list", []string{"192.0.2.0/24", "198.51.100.7:443", "203.0.113.0/28:53"}}} {
		b.Run(tc.name, func(b *testing.B) {
			m := benchManager(b)
			rules, _ := ParseEgress(tc.egress)
			ip := netip.MustParseAddr("10.250.0.9")
			mac := MACFor(ip.AsSlice())
			var add, del time.Duration
			for i := 0; i < b.N; i++ {
				t0 := time.Now()
				if err := m.setPort(context.Background(), "rfybench0", ip, mac, rules); err != nil {
					b.Fatal(err)
				}
				t1 := time.Now()
				if err := m.dropPort("rfybench0"); err != nil {
					b.Fatal(err)
				}
				add += t1.Sub(t0)
				del += time.Since(t1)
				m.bg.Wait() // the background conntrack clean-up, not part of Detach's latency
			}
			b.ReportMetric(float64(add.Microseconds())/float64(b.N), "µs-attach")
			b.ReportMetric(float64(del.Microseconds())/float64(b.N), "µs-detach")
		})
	}
}

func benchManager(b *testing.B) *Manager {
	if os.Geteuid() != 0 {
		b.Skip("needs root")
	}
	m, err := New(context.Background(), Config{Bridge: testBridge, CIDR: testCIDR, table: testTable}, nil)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() {
		m.Close()
		if l, err := netlink.LinkByName(testBridge); err == nil {
			netlink.LinkDel(l)
		}
		if c, err := nftables.New(); err == nil {
			for _, fam := range []nftables.TableFamily{nftables.TableFamilyIPv4, nftables.TableFamilyBridge} {
				tb := &nftables.Table{Name: testTable, Family: fam}
				c.AddTable(tb)
				c.DelTable(tb)
			}
			c.Flush()
		}
	})
	return m
}

// TestDetachForgetsFlows: the conntrack entries of flows two sandboxes started are gone once both are detached
// (an "established" rule would otherwise let the rest of such a flow through for the address's next owner); the
// two detaches, close together, share the walk of the conntrack table.
func TestDetachForgetsFlows(t *testing.T) {
	m := newTestManager(t, nil)
	ln := listenGreeter(t, m.Gateway().String())
	var ips []net.IP
	var veths []string
	for i, id := range []string{"sbx_aaaaaaaaaaaa0000000000000000000a", "sbx_bbbbbbbbbbbb0000000000000000000b"} {
		ns := testnet.NewNS(t)
		ip, err := m.Allocate(nil)
		if err != nil {
			t.Fatal(err)
		}
		veth := VethName(id)
		t.Cleanup(func() { _ = m.Detach(veth) })
		if err := m.Attach(context.Background(), int(ns), ip, veth, []string{ln.Addr().String()}); err != nil {
			t.Fatalf("Attach %d: %v", i, err)
		}
		if err := dialFrom(ns, ln.Addr().String()); err != nil {
			t.Fatalf("dial from sandbox %d: %v", i, err)
		}
		ips, veths = append(ips, ip), append(veths, veth)
	}
	flowsFrom := func(ip net.IP) int {
		flows, err := netlink.ConntrackTableList(netlink.ConntrackTable, unix.AF_INET)
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for _, f := range flows {
			if f.Forward.SrcIP.Equal(ip) {
				n++
			}
		}
		return n
	}
	for _, ip := range ips {
		if flowsFrom(ip) == 0 {
			t.Fatalf("no conntrack entry for the flow %s started", ip)
		}
	}
	walks0 := m.forget.walks
	for _, v := range veths {
		if err := m.Detach(v); err != nil {
			t.Fatal(err)
		}
	}
	m.bg.Wait()
	for _, ip := range ips {
		if n := flowsFrom(ip); n != 0 {
			t.Errorf("%d conntrack entries of %s left after Detach", n, ip)
		}
	}
	t.Logf("conntrack table walks for two detaches: %d", m.forget.walks-walks0)
}

// TestAllocateSkipsAddressesBeingForgotten: an address whose previous owner's flows are still in conntrack is not
// handed out again until they are forgotten.
func TestAllocateSkipsAddressesBeingForgotten(t *testing.T) {
	m := newTestManager(t, nil)
	free := netip.MustParseAddr("10.250.0.7")
	onlyFree := func(ip net.IP) bool { return !ip.Equal(free.AsSlice()) }
	m.forget.mu.Lock()
	m.forget.waiting = map[netip.Addr]bool{free: true}
	m.forget.mu.Unlock()
	if ip, err := m.Allocate(onlyFree); !errors.Is(err, errdefs.ErrConflict) {
		t.Fatalf("Allocate while %s's flows are being forgotten: %v, %v; want a conflict", free, ip, err)
	}
	m.forget.mu.Lock()
	delete(m.forget.waiting, free)
	m.forget.mu.Unlock()
	if ip, err := m.Allocate(onlyFree); err != nil || !ip.Equal(free.AsSlice()) {
		t.Fatalf("Allocate once forgotten: %v, %v; want %s", ip, err, free)
	}
}
