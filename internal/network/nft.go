package network

import (
	"encoding/binary"
	"fmt"
	"net"
	"net/netip"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// Chain and set names inside the tables.
const (
	chainPostrouting = "postrouting"
	chainForward     = "forward"
	chainInput       = "input"
	chainEgress      = "egress"
	chainPorts       = "ports"
	chainDeny        = "deny"

	setPins    = "pins"    // bridge table: ifname . ether_addr . ipv4_addr of every sandbox port
	setMembers = "members" // bridge table: the names of the sandbox ports
	setCustom  = "custom"  // ip table: sandboxes with their own egress list (nothing else is open to them)
	setAny     = "eg_any"  // ip table: saddr . daddr-range open on every port
	setPort    = "eg_port"
)

// Reserved is what a sandbox does not reach by default, besides every address of the host and the networks
// the host is connected to (hostnets.go): the private, shared, loopback, link-local, multicast and reserved IPv4
// ranges (RFC 6890). The documentation ranges (192.0.2.0/24, 198.51.100.0/24, 203.0.113.0/24) are not in it:
// they are routed nowhere on the internet, and the tests use those the host is not on to stand for "a public
// address" (internal/testnet).
var Reserved = []netip.Prefix{
	netip.MustParsePrefix("0.0.0.0/8"),
	netip.MustParsePrefix("10.0.0.0/8"),
	netip.MustParsePrefix("100.64.0.0/10"),
	netip.MustParsePrefix("127.0.0.0/8"),
	netip.MustParsePrefix("169.254.0.0/16"),
	netip.MustParsePrefix("172.16.0.0/12"),
	netip.MustParsePrefix("192.0.0.0/24"),
	netip.MustParsePrefix("192.168.0.0/16"),
	netip.MustParsePrefix("198.18.0.0/15"),
	netip.MustParsePrefix("224.0.0.0/4"),
	netip.MustParsePrefix("240.0.0.0/4"),
}

// nftSets are the set handles of both tables, for adding and deleting elements later.
type nftSets struct {
	pins, members, custom, anyS, port *nftables.Set
}

func newSets(table, bridgeTable *nftables.Table) nftSets {
	return nftSets{
		pins: &nftables.Set{Table: bridgeTable, Name: setPins, Concatenation: true,
			KeyType: nftables.MustConcatSetType(nftables.TypeIFName, nftables.TypeEtherAddr, nftables.TypeIPAddr)},
		members: &nftables.Set{Table: bridgeTable, Name: setMembers, KeyType: nftables.TypeIFName},
		custom:  &nftables.Set{Table: table, Name: setCustom, KeyType: nftables.TypeIPAddr},
		anyS: &nftables.Set{Table: table, Name: setAny, Concatenation: true, Interval: true,
			KeyType: nftables.MustConcatSetType(nftables.TypeIPAddr, nftables.TypeIPAddr)},
		port: &nftables.Set{Table: table, Name: setPort, Concatenation: true, Interval: true,
			KeyType: nftables.MustConcatSetType(nftables.TypeIPAddr, nftables.TypeIPAddr, nftables.TypeInetProto,
				nftables.TypeInetService)},
	}
}

// nftPolicy is the host-wide part of the rules.
type nftPolicy struct {
	table, bridge string
	cidr          *net.IPNet
	opened        []netip.Prefix // operator's --egress-allow
	resolvers     []netip.Addr   // DNS servers every default-policy sandbox may query on port 53
	hostNets      []netip.Prefix // the host's own networks outside cidr and Reserved (see hostnets.go)
}

// oldElements reads the elements of the sets of a table left by a previous run (nil when there is none).
func oldElements(c *nftables.Conn, s nftSets) map[string][]nftables.SetElement {
	out := map[string][]nftables.SetElement{}
	for _, set := range []*nftables.Set{s.pins, s.members, s.custom, s.anyS, s.port} {
		els, err := c.GetSetElements(set)
		if err != nil {
			continue
		}
		out[set.Name] = els
	}
	return out
}

// ensureNFT replaces two tables with the current rules, in one atomic batch:
//
//	table bridge ramify_BR {
//	  set pins { type ifname . ether_addr . ipv4_addr }
//	  set members { type ifname }
//	  chain ports { type filter hook prerouting priority -200; policy accept;
//	    iifname != @members accept       # other bridges' ports (this kernel has no "meta ibrname")
//	    ether type arp arp hlen 6 arp plen 4 iifname . arp saddr ether . arp saddr ip @pins
//	        iifname . ether saddr . arp saddr ip @pins accept
//	    ether type ip iifname . ether saddr . ip saddr @pins accept
//	    drop }                       # IPv6, VLAN tags, forged sources, unknown ports
//	}
//	table ip ramify_BR {
//	  set custom { type ipv4_addr }
//	  set eg_any { type ipv4_addr . ipv4_addr; flags interval }
//	  set eg_port { type ipv4_addr . ipv4_addr . inet_proto . inet_service; flags interval }
//	  chain postrouting { type nat hook postrouting priority srcnat; ip saddr CIDR oifname != BR masquerade }
//	  chain egress {
//	    ip saddr . ip daddr @eg_any accept
//	    ip saddr . ip daddr . meta l4proto . th dport @eg_port accept
//	    ip saddr @custom jump deny
//	    ip daddr RESOLVER udp/tcp dport 53 accept      # for each resolver
//	    ip daddr OPENED accept }                       # for each --egress-allow CIDR
//	  chain forward { type filter hook forward priority filter; policy accept;
//	    iifname BR oifname BR jump deny
//	    iifname BR ct state established,related accept
//	    iifname BR jump egress
//	    iifname BR ip daddr RESERVED jump deny         # for each reserved range, and CIDR
//	    iifname BR jump hostnets
//	    iifname BR accept
//	    oifname BR ct state established,related accept
//	    oifname BR drop }
//	  chain input { type filter hook input priority filter; policy accept;
//	    iifname BR ct state established,related accept
//	    iifname BR jump egress
//	    iifname BR jump deny }
//	  chain hostnets {
//	    ip daddr NET jump deny }                       # for each of the host's own networks (hostnets.go)
//	  chain deny { meta l4proto tcp reject with tcp reset; reject with icmp admin-prohibited }
//	}
//
// "add table; delete table; add table ..." makes a second run converge without duplicates, and there is no
// moment without rules. keep, when set, is the elements to put back in the new sets (a restart keeps the
// running sandboxes' pins and policies).
func ensureNFT(c *nftables.Conn, p nftPolicy, keep map[string][]nftables.SetElement) (nftSets, error) {
	t := &nftables.Table{Name: p.table, Family: nftables.TableFamilyIPv4}
	bt := &nftables.Table{Name: p.table, Family: nftables.TableFamilyBridge}
	for _, tb := range []*nftables.Table{t, bt} {
		c.AddTable(tb)
		c.DelTable(tb)
	}
	t = c.AddTable(&nftables.Table{Name: p.table, Family: nftables.TableFamilyIPv4})
	bt = c.AddTable(&nftables.Table{Name: p.table, Family: nftables.TableFamilyBridge})
	sets := newSets(t, bt)
	for _, s := range []*nftables.Set{sets.pins, sets.members, sets.custom, sets.anyS, sets.port} {
		if err := c.AddSet(s, keep[s.Name]); err != nil {
			return sets, fmt.Errorf("set %s: %w", s.Name, err)
		}
	}
	br := ifname(p.bridge)

	// The bridge table: every frame a sandbox sends carries its own MAC and IP, or is dropped.
	accept := nftables.ChainPolicyAccept
	ports := c.AddChain(&nftables.Chain{Name: chainPorts, Table: bt, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookPrerouting, Priority: nftables.ChainPriorityRef(-200), Policy: &accept})
	c.AddRule(&nftables.Rule{Table: bt, Chain: ports, Exprs: []expr.Any{
		&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: 1},
		&expr.Lookup{SourceRegister: 1, SetName: sets.members.Name, SetID: sets.members.ID, Invert: true},
		&expr.Verdict{Kind: expr.VerdictAccept},
	}})
	c.AddRule(&nftables.Rule{Table: bt, Chain: ports, Exprs: append(etherType(unix.ETH_P_ARP),
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 4, Len: 2},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{6, 4}},
		&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: 8},
		&expr.Payload{DestRegister: 12, Base: expr.PayloadBaseNetworkHeader, Offset: 8, Len: 6},  // arp sha
		&expr.Payload{DestRegister: 14, Base: expr.PayloadBaseNetworkHeader, Offset: 14, Len: 4}, // arp spa
		&expr.Lookup{SourceRegister: 8, SetName: sets.pins.Name, SetID: sets.pins.ID},
		&expr.Payload{DestRegister: 12, Base: expr.PayloadBaseLLHeader, Offset: 6, Len: 6}, // ether saddr
		&expr.Lookup{SourceRegister: 8, SetName: sets.pins.Name, SetID: sets.pins.ID},
		&expr.Verdict{Kind: expr.VerdictAccept},
	)})
	c.AddRule(&nftables.Rule{Table: bt, Chain: ports, Exprs: append(etherType(unix.ETH_P_IP),
		&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: 8},
		&expr.Payload{DestRegister: 12, Base: expr.PayloadBaseLLHeader, Offset: 6, Len: 6},
		&expr.Payload{DestRegister: 14, Base: expr.PayloadBaseNetworkHeader, Offset: 12, Len: 4},
		&expr.Lookup{SourceRegister: 8, SetName: sets.pins.Name, SetID: sets.pins.ID},
		&expr.Verdict{Kind: expr.VerdictAccept},
	)})
	c.AddRule(&nftables.Rule{Table: bt, Chain: ports, Exprs: []expr.Any{
		&expr.Counter{},
		&expr.Verdict{Kind: expr.VerdictDrop},
	}})

	// The ip table.
	post := c.AddChain(&nftables.Chain{Name: chainPostrouting, Table: t, Type: nftables.ChainTypeNAT,
		Hooknum: nftables.ChainHookPostrouting, Priority: nftables.ChainPriorityNATSource})
	c.AddRule(&nftables.Rule{Table: t, Chain: post, Exprs: masqueradeExprs(p.bridge, p.cidr)})

	// Refused traffic is rejected rather than dropped, so a program in the sandbox fails at once (connection
	// refused, host unreachable) instead of hanging until its timeout.
	deny := c.AddChain(&nftables.Chain{Name: chainDeny, Table: t})
	c.AddRule(&nftables.Rule{Table: t, Chain: deny, Exprs: []expr.Any{
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{unix.IPPROTO_TCP}},
		&expr.Counter{},
		&expr.Reject{Type: unix.NFT_REJECT_TCP_RST},
	}})
	c.AddRule(&nftables.Rule{Table: t, Chain: deny, Exprs: []expr.Any{
		&expr.Counter{},
		&expr.Reject{Type: unix.NFT_REJECT_ICMP_UNREACH, Code: 13}, // communication administratively prohibited
	}})

	eg := c.AddChain(&nftables.Chain{Name: chainEgress, Table: t})
	c.AddRule(&nftables.Rule{Table: t, Chain: eg, Exprs: []expr.Any{
		&expr.Payload{DestRegister: 8, Base: expr.PayloadBaseNetworkHeader, Offset: 12, Len: 4},
		&expr.Payload{DestRegister: 9, Base: expr.PayloadBaseNetworkHeader, Offset: 16, Len: 4},
		&expr.Lookup{SourceRegister: 8, SetName: sets.anyS.Name, SetID: sets.anyS.ID},
		&expr.Verdict{Kind: expr.VerdictAccept},
	}})
	c.AddRule(&nftables.Rule{Table: t, Chain: eg, Exprs: []expr.Any{
		&expr.Payload{DestRegister: 8, Base: expr.PayloadBaseNetworkHeader, Offset: 12, Len: 4},
		&expr.Payload{DestRegister: 9, Base: expr.PayloadBaseNetworkHeader, Offset: 16, Len: 4},
		&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 10},
		&expr.Payload{DestRegister: 11, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
		&expr.Lookup{SourceRegister: 8, SetName: sets.port.Name, SetID: sets.port.ID},
		&expr.Verdict{Kind: expr.VerdictAccept},
	}})
	c.AddRule(&nftables.Rule{Table: t, Chain: eg, Exprs: []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 12, Len: 4},
		&expr.Lookup{SourceRegister: 1, SetName: sets.custom.Name, SetID: sets.custom.ID},
		&expr.Verdict{Kind: expr.VerdictJump, Chain: chainDeny},
	}})
	for _, r := range p.resolvers {
		for _, proto := range []byte{unix.IPPROTO_UDP, unix.IPPROTO_TCP} {
			c.AddRule(&nftables.Rule{Table: t, Chain: eg, Exprs: []expr.Any{
				&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 16, Len: 4},
				&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: r.AsSlice()},
				&expr.Meta{Key: expr.MetaKeyL4PROTO, Register: 1},
				&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{proto}},
				&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseTransportHeader, Offset: 2, Len: 2},
				&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{0, 53}},
				&expr.Verdict{Kind: expr.VerdictAccept},
			}})
		}
	}
	for _, o := range p.opened {
		c.AddRule(&nftables.Rule{Table: t, Chain: eg, Exprs: append(daddrIn(o), &expr.Verdict{Kind: expr.VerdictAccept})})
	}

	fwd := c.AddChain(&nftables.Chain{Name: chainForward, Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookForward, Priority: nftables.ChainPriorityFilter, Policy: &accept})
	// Sandboxes never reach each other, not even routed through the host: the bridge ports are isolated at L2
	// (see Attach) and this rule drops what would come back out of the bridge at L3.
	c.AddRule(&nftables.Rule{Table: t, Chain: fwd, Exprs: []expr.Any{
		iif(), &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: br},
		oif(), &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: br},
		&expr.Verdict{Kind: expr.VerdictJump, Chain: chainDeny},
	}})
	c.AddRule(&nftables.Rule{Table: t, Chain: fwd, Exprs: append([]expr.Any{
		iif(), &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: br}}, ctEstablished(expr.VerdictAccept)...)})
	c.AddRule(&nftables.Rule{Table: t, Chain: fwd, Exprs: []expr.Any{
		iif(), &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: br},
		&expr.Verdict{Kind: expr.VerdictJump, Chain: chainEgress},
	}})
	cidrPrefix, _ := netip.ParsePrefix(p.cidr.String())
	for _, r := range append(append([]netip.Prefix(nil), Reserved...), cidrPrefix) {
		c.AddRule(&nftables.Rule{Table: t, Chain: fwd, Exprs: append(append([]expr.Any{
			iif(), &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: br}}, daddrIn(r)...),
			&expr.Verdict{Kind: expr.VerdictJump, Chain: chainDeny})})
	}
	// The host's own networks (its LAN, its VPC subnet), which are not always on reserved ranges. They change
	// (checkHostNets), so they are a chain of their own, rewritten alone.
	hn := c.AddChain(&nftables.Chain{Name: chainHostNets, Table: t})
	addHostNetRules(c, t, hn, p.hostNets)
	c.AddRule(&nftables.Rule{Table: t, Chain: fwd, Exprs: []expr.Any{
		iif(), &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: br},
		&expr.Verdict{Kind: expr.VerdictJump, Chain: chainHostNets},
	}})
	c.AddRule(&nftables.Rule{Table: t, Chain: fwd, Exprs: []expr.Any{
		iif(), &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: br},
		&expr.Counter{},
		&expr.Verdict{Kind: expr.VerdictAccept},
	}})
	c.AddRule(&nftables.Rule{Table: t, Chain: fwd, Exprs: append([]expr.Any{
		oif(), &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: br}}, ctEstablished(expr.VerdictAccept)...)})
	c.AddRule(&nftables.Rule{Table: t, Chain: fwd, Exprs: []expr.Any{
		oif(), &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: br},
		&expr.Counter{},
		&expr.Verdict{Kind: expr.VerdictDrop},
	}})

	in := c.AddChain(&nftables.Chain{Name: chainInput, Table: t, Type: nftables.ChainTypeFilter,
		Hooknum: nftables.ChainHookInput, Priority: nftables.ChainPriorityFilter, Policy: &accept})
	c.AddRule(&nftables.Rule{Table: t, Chain: in, Exprs: append([]expr.Any{
		iif(), &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: br}}, ctEstablished(expr.VerdictAccept)...)})
	c.AddRule(&nftables.Rule{Table: t, Chain: in, Exprs: []expr.Any{
		iif(), &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: br},
		&expr.Verdict{Kind: expr.VerdictJump, Chain: chainEgress},
	}})
	c.AddRule(&nftables.Rule{Table: t, Chain: in, Exprs: []expr.Any{
		iif(), &expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: br},
		&expr.Verdict{Kind: expr.VerdictJump, Chain: chainDeny},
	}})
	if err := c.Flush(); err != nil {
		return sets, fmt.Errorf("apply: %w", err)
	}
	return sets, nil
}

func iif() expr.Any { return &expr.Meta{Key: expr.MetaKeyIIFNAME, Register: 1} }
func oif() expr.Any { return &expr.Meta{Key: expr.MetaKeyOIFNAME, Register: 1} }

// etherType is "ether type T".
func etherType(t uint16) []expr.Any {
	return []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseLLHeader, Offset: 12, Len: 2},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte{byte(t >> 8), byte(t)}},
	}
}

// ctEstablished is "ct state established,related VERDICT".
func ctEstablished(v expr.VerdictKind) []expr.Any {
	return []expr.Any{
		&expr.Ct{Key: expr.CtKeySTATE, Register: 1},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4,
			Mask: native32(expr.CtStateBitESTABLISHED | expr.CtStateBitRELATED), Xor: native32(0)},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: native32(0)},
		&expr.Counter{},
		&expr.Verdict{Kind: v},
	}
}

// daddrIn is "ip daddr PREFIX".
func daddrIn(p netip.Prefix) []expr.Any {
	mask := net.CIDRMask(p.Bits(), 32)
	return []expr.Any{
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 16, Len: 4},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: []byte(mask), Xor: make([]byte, 4)},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: p.Masked().Addr().AsSlice()},
	}
}

// masqueradeExprs is "ip saddr CIDR oifname != BRIDGE masquerade".
func masqueradeExprs(bridge string, cidr *net.IPNet) []expr.Any {
	return []expr.Any{
		// ip saddr & mask == network
		&expr.Payload{DestRegister: 1, Base: expr.PayloadBaseNetworkHeader, Offset: 12, Len: 4},
		&expr.Bitwise{SourceRegister: 1, DestRegister: 1, Len: 4, Mask: []byte(cidr.Mask), Xor: make([]byte, 4)},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: []byte(cidr.IP.To4())},
		// oifname != bridge
		&expr.Meta{Key: expr.MetaKeyOIFNAME, Register: 1},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: ifname(bridge)},
		&expr.Counter{},
		&expr.Masq{},
	}
}

// Element keys. Concatenations pad each field to 4 bytes.

func pinKey(veth string, mac net.HardwareAddr, ip netip.Addr) []byte {
	k := make([]byte, 0, 28)
	k = append(k, ifname(veth)...)
	k = append(k, mac...)
	k = append(k, 0, 0)
	return append(k, ip.AsSlice()...)
}

func u32(v uint32) []byte { return binary.BigEndian.AppendUint32(nil, v) }

func anyElem(src netip.Addr, r ipRange) nftables.SetElement {
	s := src.AsSlice()
	return nftables.SetElement{Key: append(append([]byte{}, s...), u32(r.lo)...), KeyEnd: append(append([]byte{}, s...), u32(r.hi)...)}
}

func portElem(src netip.Addr, r ipRange, proto byte, port uint16) nftables.SetElement {
	tail := []byte{proto, 0, 0, 0, byte(port >> 8), byte(port), 0, 0}
	s := src.AsSlice()
	return nftables.SetElement{
		Key:    append(append(append([]byte{}, s...), u32(r.lo)...), tail...),
		KeyEnd: append(append(append([]byte{}, s...), u32(r.hi)...), tail...),
	}
}

// elemsOf turns a plan into set elements for the sandbox at src.
func elemsOf(src netip.Addr, p egressPlan) (anyE, portE []nftables.SetElement) {
	for _, r := range p.any {
		anyE = append(anyE, anyElem(src, r))
	}
	for port, rs := range p.ports {
		for _, r := range rs {
			anyE := portElem(src, r, unix.IPPROTO_TCP, port)
			portE = append(portE, anyE, portElem(src, r, unix.IPPROTO_UDP, port))
		}
	}
	return anyE, portE
}

// ifname pads an interface name to IFNAMSIZ with NULs, as the kernel compares it.
func ifname(n string) []byte {
	b := make([]byte, unix.IFNAMSIZ)
	copy(b, n)
	return b
}

// native32 is v in host byte order (conntrack state bits are compared in host order).
func native32(v uint32) []byte {
	b := make([]byte, 4)
	binary.NativeEndian.PutUint32(b, v)
	return b
}
