package network

import (
	"encoding/binary"
	"fmt"
	"net"

	"github.com/google/nftables"
	"github.com/google/nftables/expr"
	"golang.org/x/sys/unix"
)

// Chain names inside TableName.
const (
	chainPostrouting = "postrouting"
	chainForward     = "forward"
)

// ensureNFT replaces the table ("ramify", family ip) with one holding:
//
//	chain postrouting { type nat hook postrouting priority srcnat; ip saddr CIDR oifname != BRIDGE masquerade }
//	chain forward { type filter hook forward priority filter; policy accept;
//	    iifname BRIDGE oifname BRIDGE drop
//	    iifname BRIDGE accept
//	    oifname BRIDGE ct state established,related accept }
//
// It runs as one atomic batch: "add table" (a no-op if it exists), "delete table", then the full definition, so a
// second run never duplicates chains or rules and there is no moment without the rules.
func ensureNFT(table, bridge string, cidr *net.IPNet) error {
	c, err := nftables.New()
	if err != nil {
		return err
	}
	t := &nftables.Table{Name: table, Family: nftables.TableFamilyIPv4}
	c.AddTable(t)
	c.DelTable(t)
	t = c.AddTable(&nftables.Table{Name: table, Family: nftables.TableFamilyIPv4})

	post := c.AddChain(&nftables.Chain{
		Name:     chainPostrouting,
		Table:    t,
		Type:     nftables.ChainTypeNAT,
		Hooknum:  nftables.ChainHookPostrouting,
		Priority: nftables.ChainPriorityNATSource,
	})
	c.AddRule(&nftables.Rule{Table: t, Chain: post, Exprs: masqueradeExprs(bridge, cidr)})

	accept := nftables.ChainPolicyAccept
	fwd := c.AddChain(&nftables.Chain{
		Name:     chainForward,
		Table:    t,
		Type:     nftables.ChainTypeFilter,
		Hooknum:  nftables.ChainHookForward,
		Priority: nftables.ChainPriorityFilter,
		Policy:   &accept,
	})
	// Sandboxes never reach each other, not even routed through the host: the bridge ports are isolated at L2
	// (see Attach) and this rule drops what would come back out of the bridge at L3.
	c.AddRule(&nftables.Rule{Table: t, Chain: fwd, Exprs: []expr.Any{
		&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: ifname(bridge)},
		&expr.Meta{Key: expr.MetaKeyOIFNAME, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: ifname(bridge)},
		&expr.Counter{},
		&expr.Verdict{Kind: expr.VerdictDrop},
	}})
	c.AddRule(&nftables.Rule{Table: t, Chain: fwd, Exprs: []expr.Any{
		&expr.Meta{Key: expr.MetaKeyIIFNAME, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: ifname(bridge)},
		&expr.Counter{},
		&expr.Verdict{Kind: expr.VerdictAccept},
	}})
	c.AddRule(&nftables.Rule{Table: t, Chain: fwd, Exprs: []expr.Any{
		&expr.Meta{Key: expr.MetaKeyOIFNAME, Register: 1},
		&expr.Cmp{Op: expr.CmpOpEq, Register: 1, Data: ifname(bridge)},
		&expr.Ct{Key: expr.CtKeySTATE, Register: 1},
		&expr.Bitwise{
			SourceRegister: 1, DestRegister: 1, Len: 4,
			Mask: native32(expr.CtStateBitESTABLISHED | expr.CtStateBitRELATED),
			Xor:  native32(0),
		},
		&expr.Cmp{Op: expr.CmpOpNeq, Register: 1, Data: native32(0)},
		&expr.Counter{},
		&expr.Verdict{Kind: expr.VerdictAccept},
	}})
	if err := c.Flush(); err != nil {
		return fmt.Errorf("apply: %w", err)
	}
	return nil
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
