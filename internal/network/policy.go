package network

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/google/nftables"
	"github.com/ramify-dev/ramify/internal/errdefs"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// initNFT opens the lasting nftables connection and (re)writes both tables, keeping the pins and policy elements
// of ports whose veth still exists (sandboxes that survive a server restart keep their network).
func (m *Manager) initNFT(opened []netip.Prefix) error {
	c, err := nftables.New(nftables.AsLasting())
	if err != nil {
		return err
	}
	t := &nftables.Table{Name: m.table, Family: nftables.TableFamilyIPv4}
	bt := &nftables.Table{Name: m.table, Family: nftables.TableFamilyBridge}
	old := oldElements(c, newSets(t, bt))
	keep := map[string][]nftables.SetElement{}
	byIP := map[netip.Addr]*port{}
	for _, e := range old[setPins] {
		if len(e.Key) != 28 {
			continue
		}
		veth := strings.TrimRight(string(e.Key[:16]), "\x00")
		if _, err := netlink.LinkByName(veth); err != nil {
			continue
		}
		ip, _ := netip.AddrFromSlice(e.Key[24:28])
		p := &port{veth: veth, ip: ip, pin: nftables.SetElement{Key: e.Key}}
		m.ports[veth] = p
		byIP[ip] = p
		keep[setPins] = append(keep[setPins], p.pin)
		keep[setMembers] = append(keep[setMembers], nftables.SetElement{Key: ifname(veth)})
	}
	for _, name := range []string{setCustom, setAny, setPort} {
		for _, e := range old[name] {
			if len(e.Key) < 4 {
				continue
			}
			ip, _ := netip.AddrFromSlice(e.Key[:4])
			p := byIP[ip]
			if p == nil {
				continue
			}
			el := nftables.SetElement{Key: e.Key, KeyEnd: e.KeyEnd}
			switch name {
			case setCustom:
				p.custom = true
			case setAny:
				p.anyE = append(p.anyE, el)
			case setPort:
				p.portE = append(p.portE, el)
			}
			keep[name] = append(keep[name], el)
		}
	}
	m.policy = nftPolicy{table: m.table, bridge: m.bridge, cidr: m.pool.network, opened: opened, resolvers: m.resolvers}
	// Refused from the first rules on: a server that cannot tell its host's networks does not start (fail closed).
	hostNets, err := currentHostNets(m.policy)
	if err != nil {
		c.CloseLasting() //nolint:errcheck
		return err
	}
	m.policy.hostNets = hostNets
	sets, err := ensureNFT(c, m.policy, keep)
	if err != nil && len(keep) > 0 {
		// The old elements did not fit the new sets (an upgrade changed them): start without them.
		m.log.Warn("nftables: could not keep the running sandboxes' elements", "err", err)
		m.ports = map[string]*port{}
		sets, err = ensureNFT(c, m.policy, nil)
	}
	if err != nil {
		c.CloseLasting() //nolint:errcheck
		return err
	}
	m.nft, m.sets = c, sets
	return nil
}

// SetEgress replaces the egress policy of the sandbox on hostVeth (a warm sandbox being claimed, a sandbox found
// again after a restart). egress is as in ParseEgress.
func (m *Manager) SetEgress(ctx context.Context, hostVeth string, egress []string) error {
	rules, err := ParseEgress(egress)
	if err != nil {
		return err
	}
	m.nftMu.Lock()
	p := m.ports[hostVeth]
	m.nftMu.Unlock()
	if p == nil {
		if rules == nil {
			return nil // no port (a sandbox without network) under the default policy: nothing to do
		}
		return fmt.Errorf("set egress of %s: %w", hostVeth, errdefs.New(errdefs.ErrNotFound, "no such port"))
	}
	// The callers change the policy of a sandbox that has run nothing yet (a warm one being claimed) or restore
	// the same policy (after a restart): there are no flows to forget.
	return m.setPort(ctx, hostVeth, p.ip, nil, rules)
}

// flowForgetter deletes the conntrack entries of flows that detached sandbox addresses started, so that
// "established" lets nothing of a destroyed sandbox's flows through for the address's next owner. Deleting them
// means walking the host's whole conntrack table (~15 ms of CPU here: every hash bucket is visited, however few
// entries there are), so the addresses detached within forgetBatchWait of each other share one walk: the first
// starts a worker, which waits, walks once for all the addresses queued meanwhile, and repeats until none are
// left. Until its walk is done an address is not handed out again (Allocate).
type flowForgetter struct {
	mu      sync.Mutex
	queued  []netip.Addr
	waiting map[netip.Addr]bool // queued or being walked for
	running bool
	walks   int // table walks made (for tests)
}

const forgetBatchWait = time.Second

// forgetFlows queues ip's flows to be forgotten, in the background.
func (m *Manager) forgetFlows(ip netip.Addr) {
	f := &m.forget
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.waiting == nil {
		f.waiting = map[netip.Addr]bool{}
	}
	f.queued = append(f.queued, ip)
	f.waiting[ip] = true
	if f.running {
		return
	}
	f.running = true
	m.bg.Add(1)
	go func() {
		defer m.bg.Done()
		for {
			select {
			case <-time.After(forgetBatchWait):
			case <-m.stop: // closing: walk for what is queued now
			}
			f.mu.Lock()
			ips := f.queued
			f.queued = nil
			if len(ips) == 0 {
				f.running = false
				f.mu.Unlock()
				return
			}
			f.walks++
			f.mu.Unlock()
			filters := make([]netlink.CustomConntrackFilter, 0, len(ips))
			for _, ip := range ips {
				cf := &netlink.ConntrackFilter{}
				if err := cf.AddIP(netlink.ConntrackOrigSrcIP, ip.AsSlice()); err == nil {
					filters = append(filters, cf)
				}
			}
			// Best effort, but a walk a concurrent change interrupted may have missed flows: walk again.
			retryDump(func() (uint, error) { //nolint:errcheck // best effort
				return netlink.ConntrackDeleteFilters(netlink.ConntrackTable, unix.AF_INET, filters...)
			})
			f.mu.Lock()
			for _, ip := range ips {
				delete(f.waiting, ip)
			}
			f.mu.Unlock()
		}
	}()
}

// forgetting reports whether ip's flows are still to be forgotten.
func (f *flowForgetter) forgetting(ip netip.Addr) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.waiting[ip]
}

// setPort makes the kernel's elements for hostVeth what ip, mac and rules say, in one batch: it adds what is
// missing and deletes what is no longer wanted, including the elements of a stale port with the same address (a
// sandbox that died while the server was down). mac nil keeps the port's current pin.
func (m *Manager) setPort(ctx context.Context, hostVeth string, ip netip.Addr, mac net.HardwareAddr, rules []EgressRule) error {
	addrs := m.resolveHosts(ctx, hosts(rules), false)
	m.nftMu.Lock()
	defer m.nftMu.Unlock()
	if m.nft == nil {
		return errors.New("network manager closed")
	}
	old := m.ports[hostVeth]
	np := &port{veth: hostVeth, ip: ip, rules: rules, custom: rules != nil}
	switch {
	case mac != nil:
		np.pin = nftables.SetElement{Key: pinKey(hostVeth, mac, ip)}
	case old != nil:
		np.pin = old.pin
	default:
		return fmt.Errorf("port %s: no MAC", hostVeth)
	}
	np.anyE, np.portE = elemsOf(ip, plan(rules, func(h string) []netip.Addr { return addrs[h] }, m.resolvers))
	var stale []*port
	if old != nil {
		stale = append(stale, old)
	}
	for _, q := range m.ports {
		if q != old && q.ip == ip {
			stale = append(stale, q)
		}
	}
	if err := m.replace(stale, np); err != nil {
		return err
	}
	for _, q := range stale {
		if q.veth != hostVeth {
			m.log.Debug("egress: removed a stale port with the same address", "veth", q.veth, "ip", ip.String(), "for", hostVeth)
		}
		delete(m.ports, q.veth)
	}
	m.ports[hostVeth] = np
	return nil
}

// dropPort deletes hostVeth's elements.
func (m *Manager) dropPort(hostVeth string) error {
	m.nftMu.Lock()
	p := m.ports[hostVeth]
	if p == nil || m.nft == nil {
		m.nftMu.Unlock()
		return nil
	}
	delete(m.ports, hostVeth)
	err := m.replace([]*port{p}, nil)
	if err != nil {
		// One batch is all or nothing: an element already gone (ENOENT) would keep every other one in the
		// kernel, untracked from now on. Delete them one by one, each in its own batch, so only the absent
		// ones fail.
		err = m.deleteEach(p)
	}
	m.nftMu.Unlock()
	if err != nil {
		return err
	}
	// In the background and outside the lock (see flowForgetter).
	m.forgetFlows(p.ip)
	return nil
}

func elemKey(e nftables.SetElement) string { return string(e.Key) + "|" + string(e.KeyEnd) }

// diff returns the elements of want not in have (add) and of have not in want (del).
func diff(have, want []nftables.SetElement) (add, del []nftables.SetElement) {
	h, w := map[string]bool{}, map[string]bool{}
	for _, e := range have {
		h[elemKey(e)] = true
	}
	for _, e := range want {
		w[elemKey(e)] = true
		if !h[elemKey(e)] {
			add = append(add, e)
		}
	}
	for _, e := range have {
		if !w[elemKey(e)] {
			del = append(del, e)
			w[elemKey(e)] = true // once
		}
	}
	return add, del
}

// replace turns the elements of the old ports into those of np (nil: none) in one batch. Called with nftMu held.
func (m *Manager) replace(old []*port, np *port) error {
	type group struct {
		set        *nftables.Set
		have, want []nftables.SetElement
	}
	gs := []*group{{set: m.sets.pins}, {set: m.sets.members}, {set: m.sets.custom}, {set: m.sets.anyS}, {set: m.sets.port}}
	collect := func(p *port, into func(g *group) *[]nftables.SetElement) {
		els := portElements(p)
		for _, g := range gs {
			*into(g) = append(*into(g), els[g.set.Name]...)
		}
	}
	for _, p := range old {
		collect(p, func(g *group) *[]nftables.SetElement { return &g.have })
	}
	if np != nil {
		collect(np, func(g *group) *[]nftables.SetElement { return &g.want })
	}
	n := 0
	// Deletions first: an interval set refuses a new element overlapping one still in it.
	for _, g := range gs {
		if _, del := diff(g.have, g.want); len(del) > 0 {
			if err := m.nft.SetDeleteElements(g.set, del); err != nil {
				return err
			}
			n++
		}
	}
	for _, g := range gs {
		if add, _ := diff(g.have, g.want); len(add) > 0 {
			if err := m.nft.SetAddElements(g.set, add); err != nil {
				return err
			}
			n++
		}
	}
	if n == 0 {
		return nil
	}
	if err := m.nft.Flush(); err != nil {
		return fmt.Errorf("nftables elements: %w", err)
	}
	return nil
}

// portElements is p's elements in each set, by set name.
func portElements(p *port) map[string][]nftables.SetElement {
	out := map[string][]nftables.SetElement{
		setPins:    {p.pin},
		setMembers: {{Key: ifname(p.veth)}},
		setAny:     p.anyE,
		setPort:    p.portE,
	}
	if p.custom {
		out[setCustom] = []nftables.SetElement{{Key: p.ip.AsSlice()}}
	}
	return out
}

// guardEvery is how often the Manager checks that its nftables tables are still in place.
const guardEvery = time.Second

// guard puts the tables back, with every port's pin and policy, when another program removed them: `systemctl
// restart nftables` on Debian loads /etc/nftables.conf, which begins with "flush ruleset", and a firewall
// manager may do the same. Without the tables every sandbox can reach the host and the other sandboxes, spoof
// its address, and has no egress policy; new ports fail to get their elements. Called from refreshLoop.
func (m *Manager) guard() {
	m.nftMu.Lock()
	defer m.nftMu.Unlock()
	if m.tablesIntact() {
		return
	}
	keep := map[string][]nftables.SetElement{}
	for _, p := range m.ports {
		for name, els := range portElements(p) {
			keep[name] = append(keep[name], els...)
		}
	}
	sets, err := ensureNFT(m.nft, m.policy, keep)
	if err != nil {
		m.log.Error("nftables: the sandboxes' tables were removed by another program and could not be restored", "table", m.table, "err", err)
		return
	}
	m.sets = sets
	m.log.Warn("nftables: the sandboxes' tables were removed or changed by another program (nft flush ruleset?): restored",
		"table", m.table, "ports", len(m.ports))
}

// tablesIntact reports whether both tables and their chains are there. Called with nftMu held.
func (m *Manager) tablesIntact() bool {
	t := &nftables.Table{Name: m.table, Family: nftables.TableFamilyIPv4}
	bt := &nftables.Table{Name: m.table, Family: nftables.TableFamilyBridge}
	for _, c := range []struct {
		t     *nftables.Table
		chain string
	}{{bt, chainPorts}, {t, chainPostrouting}, {t, chainDeny}, {t, chainEgress}, {t, chainHostNets}, {t, chainForward}, {t, chainInput}} {
		if _, err := m.nft.ListChain(c.t, c.chain); err != nil {
			return false
		}
	}
	return true
}

// deleteEach removes p's elements one batch each; an element that is not there is not an error. Called with
// nftMu held.
func (m *Manager) deleteEach(p *port) error {
	var errs []error
	del := func(set *nftables.Set, es ...nftables.SetElement) {
		for _, e := range es {
			if err := m.nft.SetDeleteElements(set, []nftables.SetElement{e}); err != nil {
				errs = append(errs, err)
				continue
			}
			if err := m.nft.Flush(); err != nil && !errors.Is(err, unix.ENOENT) {
				errs = append(errs, fmt.Errorf("nftables element of %s: %w", p.veth, err))
			}
		}
	}
	del(m.sets.pins, p.pin)
	del(m.sets.members, nftables.SetElement{Key: ifname(p.veth)})
	if p.custom {
		del(m.sets.custom, nftables.SetElement{Key: p.ip.AsSlice()})
	}
	del(m.sets.anyS, p.anyE...)
	del(m.sets.port, p.portE...)
	return errors.Join(errs...)
}

// resolveHosts returns the addresses of each hostname: from the cache when younger than the refresh period (or
// always, unless force), else looked up now. A failed lookup keeps the last known addresses.
func (m *Manager) resolveHosts(ctx context.Context, hs []string, force bool) map[string][]netip.Addr {
	out := map[string][]netip.Addr{}
	for _, h := range hs {
		if _, ok := out[h]; ok {
			continue
		}
		m.namesMu.Lock()
		r := m.names[h]
		m.namesMu.Unlock()
		if r != nil && !force && time.Since(r.at) < m.every {
			out[h] = r.addrs
			continue
		}
		lctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		addrs, err := m.lookup(lctx, h)
		cancel()
		if err != nil {
			m.log.Warn("egress: resolve hostname", "host", h, "err", err)
			if r != nil {
				out[h] = r.addrs
			}
			continue
		}
		var v4 []netip.Addr
		for _, a := range addrs {
			if a = a.Unmap(); a.Is4() {
				v4 = append(v4, a)
			}
		}
		m.namesMu.Lock()
		m.names[h] = &resolved{addrs: v4, at: time.Now()}
		m.namesMu.Unlock()
		out[h] = v4
	}
	return out
}

// refreshLoop resolves the hostnames of every port's egress list again every period and updates the elements.
func (m *Manager) refreshLoop(every time.Duration) {
	defer close(m.done)
	t := time.NewTicker(every)
	defer t.Stop()
	g := time.NewTicker(guardEvery)
	defer g.Stop()
	for {
		select {
		case <-m.stop:
			return
		case <-g.C:
			m.guard()
			m.checkHostNets()
		case <-t.C:
			m.refresh()
		}
	}
}

func (m *Manager) refresh() {
	m.nftMu.Lock()
	var hs []string
	type job struct {
		veth  string
		ip    netip.Addr
		rules []EgressRule
	}
	var jobs []job
	for _, p := range m.ports {
		if h := hosts(p.rules); len(h) > 0 {
			hs = append(hs, h...)
			jobs = append(jobs, job{p.veth, p.ip, p.rules})
		}
	}
	m.nftMu.Unlock()
	if len(jobs) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	m.resolveHosts(ctx, hs, true)
	for _, j := range jobs {
		m.nftMu.Lock()
		p := m.ports[j.veth]
		m.nftMu.Unlock()
		if p == nil || p.ip != j.ip {
			continue // detached meanwhile
		}
		if err := m.setPort(ctx, j.veth, j.ip, nil, j.rules); err != nil {
			m.log.Warn("egress: update resolved addresses", "veth", j.veth, "err", err)
		}
	}
}

// ResolversFrom returns the IPv4 nameservers of the given resolv.conf files (for Config.Resolvers), without
// duplicates and without loopback ones; a missing file adds none.
func ResolversFrom(paths ...string) []netip.Addr {
	out := []netip.Addr{}
	seen := map[netip.Addr]bool{}
	for _, p := range paths {
		for _, a := range hostResolvers(p) {
			if !seen[a] {
				seen[a] = true
				out = append(out, a)
			}
		}
	}
	return out
}

// hostResolvers reads the IPv4 nameservers of a resolv.conf, leaving out loopback ones.
func hostResolvers(path string) []netip.Addr {
	f, err := os.Open(path)
	if err != nil {
		return []netip.Addr{}
	}
	defer f.Close()
	out := []netip.Addr{}
	seen := map[netip.Addr]bool{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		if len(fs) < 2 || fs[0] != "nameserver" {
			continue
		}
		a, err := netip.ParseAddr(fs[1])
		if err != nil || !a.Is4() || a.IsLoopback() || a.IsUnspecified() || seen[a] {
			continue
		}
		seen[a] = true
		out = append(out, a)
	}
	return out
}
