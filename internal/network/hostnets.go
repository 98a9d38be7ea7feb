package network

import (
	"fmt"
	"net"
	"net/netip"
	"slices"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"github.com/vishvananda/netlink"
	"golang.org/x/sys/unix"
)

// The networks directly connected to the host (its LAN, a cloud VPC subnet) are refused to default sandboxes
// even when they are not on a private range: "the sandbox reaches the internet, not my network". They are the
// prefixes of the host's IPv4 addresses (and the peer prefix of point-to-point ones) and the gateways of its
// default routes (a gateway reached "onlink" from a /32 address is outside every address prefix), less what the
// policy refuses anyway: loopback, this server's bridge (its subnet), other bridges on private ranges. Traffic to
// the internet through the host's gateway is forwarded to the internet address, not addressed to the gateway, so
// refusing the gateway's prefix as a destination leaves internet egress open.
//
// The host's addresses and default routes are read as the server starts and again every second with the tables'
// check (two small netlink dumps); a change rewrites the hostnets chain in one batch.

const chainHostNets = "hostnets"

// hostNetworks returns the networks of addrs (the host's IPv4 addresses) and gateways (of its default routes) that
// are not already inside one of refused, sorted, without duplicates or prefixes inside another one.
func hostNetworks(addrs []netlink.Addr, gateways []net.IP, refused []netip.Prefix) []netip.Prefix {
	var cand []netip.Prefix
	add := func(n *net.IPNet) {
		if n == nil {
			return
		}
		a, ok := netip.AddrFromSlice(n.IP.To4())
		if !ok {
			return
		}
		ones, bits := n.Mask.Size()
		if bits != 32 {
			ones = 32
		}
		cand = append(cand, netip.PrefixFrom(a, ones).Masked())
	}
	for _, a := range addrs {
		if a.Scope == unix.RT_SCOPE_HOST || a.Scope == unix.RT_SCOPE_NOWHERE {
			continue // loopback-like: not reachable as a network from a sandbox
		}
		add(a.IPNet)
		add(a.Peer)
	}
	for _, g := range gateways {
		if g4 := g.To4(); g4 != nil {
			add(&net.IPNet{IP: g4, Mask: net.CIDRMask(32, 32)})
		}
	}
	// Widest first, so that a prefix inside another one comes after it and is dropped.
	slices.SortFunc(cand, func(x, y netip.Prefix) int {
		if x.Bits() != y.Bits() {
			return x.Bits() - y.Bits()
		}
		return x.Addr().Compare(y.Addr())
	})
	out := []netip.Prefix{}
	within := func(p netip.Prefix, in []netip.Prefix) bool {
		for _, q := range in {
			if q.Bits() <= p.Bits() && q.Contains(p.Addr()) {
				return true
			}
		}
		return false
	}
	for _, p := range cand {
		if within(p, refused) || within(p, out) {
			continue
		}
		out = append(out, p)
	}
	slices.SortFunc(out, func(x, y netip.Prefix) int {
		if c := x.Addr().Compare(y.Addr()); c != 0 {
			return c
		}
		return x.Bits() - y.Bits()
	})
	return out
}

// readHostNetworks reads the host's addresses and default routes and returns hostNetworks of them.
func readHostNetworks(refused []netip.Prefix) ([]netip.Prefix, error) {
	addrs, err := retryDump(func() ([]netlink.Addr, error) { return netlink.AddrList(nil, netlink.FAMILY_V4) })
	if err != nil {
		return nil, fmt.Errorf("list the host's addresses: %w", err)
	}
	var gws []net.IP
	_, err = retryDump(func() (struct{}, error) {
		gws = gws[:0]
		return struct{}{}, netlink.RouteListFilteredIter(netlink.FAMILY_V4,
			&netlink.Route{Table: unix.RT_TABLE_MAIN}, netlink.RT_FILTER_TABLE, func(r netlink.Route) bool {
				if r.Dst != nil {
					if ones, _ := r.Dst.Mask.Size(); ones != 0 {
						return true // not a default route
					}
				}
				if r.Gw != nil {
					gws = append(gws, r.Gw)
				}
				for _, nh := range r.MultiPath {
					if nh.Gw != nil {
						gws = append(gws, nh.Gw)
					}
				}
				return true
			})
	})
	if err != nil {
		return nil, fmt.Errorf("list the host's default routes: %w", err)
	}
	return hostNetworks(addrs, gws, refused), nil
}

// alreadyRefused is what the forward path refuses without the hostnets chain: the reserved ranges and the
// server's subnet.
func (p nftPolicy) alreadyRefused() []netip.Prefix {
	out := append([]netip.Prefix(nil), Reserved...)
	if p.cidr != nil {
		if c, err := netip.ParsePrefix(p.cidr.String()); err == nil {
			out = append(out, c.Masked())
		}
	}
	return out
}

// currentHostNets reads the host's networks as the policy p should refuse them.
func currentHostNets(p nftPolicy) ([]netip.Prefix, error) {
	return readHostNetworks(p.alreadyRefused())
}

// addHostNetRules appends to batch c the rules of the hostnets chain: "ip daddr NET jump deny" for each network.
func addHostNetRules(c *nftables.Conn, t *nftables.Table, ch *nftables.Chain, nets []netip.Prefix) {
	for _, n := range nets {
		c.AddRule(&nftables.Rule{Table: t, Chain: ch, Exprs: append(daddrIn(n), &expr.Verdict{Kind: expr.VerdictJump, Chain: chainDeny})})
	}
}

// checkHostNets reads the host's networks and, when they changed, rewrites the hostnets chain (one batch). A
// failed read keeps the rules as they are. Called from refreshLoop.
func (m *Manager) checkHostNets() {
	m.nftMu.Lock()
	p := m.policy
	m.nftMu.Unlock()
	nets, err := currentHostNets(p)
	if err != nil {
		m.log.Warn("host networks: could not read them; the last ones stay refused", "err", err)
		return
	}
	m.nftMu.Lock()
	defer m.nftMu.Unlock()
	if m.nft == nil || slices.Equal(nets, m.policy.hostNets) {
		return
	}
	t := &nftables.Table{Name: m.table, Family: nftables.TableFamilyIPv4}
	ch := &nftables.Chain{Name: chainHostNets, Table: t}
	m.nft.FlushChain(ch)
	addHostNetRules(m.nft, t, ch, nets)
	if err := m.nft.Flush(); err != nil {
		// The chain is gone with its tables (the guard puts them back with m.policy) or the batch failed:
		// try again next second.
		m.log.Warn("host networks: could not update the rules", "err", err, "networks", nets)
		return
	}
	m.log.Info("host networks refused to default sandboxes changed", "was", m.policy.hostNets, "now", nets)
	m.policy.hostNets = nets
}
