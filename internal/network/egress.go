package network

import (
	"fmt"
	"net/netip"
	"sort"
	"strconv"
	"strings"

	"github.com/ramify-dev/ramify/internal/errdefs"
)

// MaxEgressEntries bounds a sandbox's egress list.
const MaxEgressEntries = 256

// EgressRule is one parsed entry of a sandbox's egress allowlist: a network (an IP is a /32) or a hostname the
// server resolves, and an optional destination port (0 = every port and protocol; otherwise TCP and UDP to
// that port).
type EgressRule struct {
	Net  netip.Prefix // valid when Host is empty
	Host string       // lower case, no trailing dot
	Port uint16
}

// ParseEgress validates a sandbox's egress list. nil means "the default policy" and parses to nil; an empty,
// non-nil list means "no outbound traffic" and parses to an empty, non-nil slice. Entries are a CIDR
// ("10.0.0.0/8"), an IPv4 address or a hostname, each optionally followed by ":port". Errors match
// errdefs.ErrInvalid and name the entry.
func ParseEgress(entries []string) ([]EgressRule, error) {
	if entries == nil {
		return nil, nil
	}
	if len(entries) > MaxEgressEntries {
		return nil, errdefs.New(errdefs.ErrInvalid, fmt.Sprintf("egress has more than %d entries", MaxEgressEntries))
	}
	out := make([]EgressRule, 0, len(entries))
	for i, s := range entries {
		r, err := ParseEgressEntry(s)
		if err != nil {
			return nil, errdefs.New(errdefs.ErrInvalid, fmt.Sprintf("egress[%d] %q: %v", i, clip(s), err))
		}
		out = append(out, r)
	}
	return out, nil
}

func clip(s string) string {
	if len(s) > 80 {
		return s[:80] + "..."
	}
	return s
}

// ParseEgressEntry parses one entry (see ParseEgress). Its errors say what is wrong, without the entry.
func ParseEgressEntry(s string) (EgressRule, error) {
	var r EgressRule
	if s == "" {
		return r, fmt.Errorf("empty entry")
	}
	if len(s) > 300 {
		return r, fmt.Errorf("longer than 300 bytes")
	}
	if strings.ContainsAny(s, "[]") || strings.Count(s, ":") > 1 {
		return r, fmt.Errorf("IPv6 is not supported (sandboxes have IPv4 only)")
	}
	addr := s
	if i := strings.IndexByte(s, ':'); i >= 0 {
		addr = s[:i]
		p, err := parsePort(s[i+1:])
		if err != nil {
			return r, err
		}
		r.Port = p
	}
	if addr == "" {
		return r, fmt.Errorf("missing address before the port")
	}
	switch {
	case strings.Contains(addr, "/"):
		p, err := netip.ParsePrefix(addr)
		if err != nil || !p.Addr().Is4() {
			return r, fmt.Errorf("not an IPv4 CIDR (like 10.0.0.0/8)")
		}
		r.Net = p.Masked()
	case looksNumeric(addr):
		a, err := netip.ParseAddr(addr)
		if err != nil || !a.Is4() {
			return r, fmt.Errorf("not an IPv4 address")
		}
		r.Net = netip.PrefixFrom(a, 32)
	default:
		h, err := parseHostname(addr)
		if err != nil {
			return r, err
		}
		r.Host = h
	}
	return r, nil
}

func parsePort(s string) (uint16, error) {
	if s == "" || len(s) > 5 {
		return 0, fmt.Errorf("port must be a number from 1 to 65535")
	}
	for _, c := range s {
		if c < '0' || c > '9' {
			return 0, fmt.Errorf("port must be a number from 1 to 65535")
		}
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 || n > 65535 {
		return 0, fmt.Errorf("port must be a number from 1 to 65535")
	}
	return uint16(n), nil
}

// looksNumeric: only digits and dots. Such a string is an address or nothing (a hostname's last label is never
// all digits), so "1.2.3" or "300.1.1.1" is an error rather than a name to resolve.
func looksNumeric(s string) bool {
	for _, c := range s {
		if c != '.' && (c < '0' || c > '9') {
			return false
		}
	}
	return true
}

func parseHostname(s string) (string, error) {
	h := strings.ToLower(strings.TrimSuffix(s, "."))
	if h == "" || len(h) > 253 {
		return "", fmt.Errorf("not a CIDR, an IPv4 address or a hostname")
	}
	labels := strings.Split(h, ".")
	for _, l := range labels {
		if l == "" || len(l) > 63 || l[0] == '-' || l[len(l)-1] == '-' {
			return "", fmt.Errorf("not a CIDR, an IPv4 address or a hostname")
		}
		for _, c := range l {
			if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
				return "", fmt.Errorf("not a CIDR, an IPv4 address or a hostname (invalid character %q)", c)
			}
		}
	}
	if looksNumeric(labels[len(labels)-1]) {
		return "", fmt.Errorf("not a CIDR, an IPv4 address or a hostname")
	}
	return h, nil
}

// ipRange is an inclusive range of IPv4 addresses as integers.
type ipRange struct{ lo, hi uint32 }

func prefixRange(p netip.Prefix) ipRange {
	a := p.Masked().Addr().As4()
	lo := uint32(a[0])<<24 | uint32(a[1])<<16 | uint32(a[2])<<8 | uint32(a[3])
	hi := lo
	if b := p.Bits(); b < 32 {
		hi = lo | (1<<(32-b) - 1)
	}
	return ipRange{lo, hi}
}

func addrU32(a netip.Addr) uint32 {
	b := a.As4()
	return uint32(b[0])<<24 | uint32(b[1])<<16 | uint32(b[2])<<8 | uint32(b[3])
}

// mergeRanges sorts and merges overlapping and adjacent ranges (nftables interval sets refuse overlaps).
func mergeRanges(rs []ipRange) []ipRange {
	if len(rs) == 0 {
		return nil
	}
	rs = append([]ipRange(nil), rs...)
	sort.Slice(rs, func(i, j int) bool { return rs[i].lo < rs[j].lo })
	out := []ipRange{rs[0]}
	for _, r := range rs[1:] {
		last := &out[len(out)-1]
		if last.hi == ^uint32(0) || r.lo <= last.hi+1 {
			if r.hi > last.hi {
				last.hi = r.hi
			}
			continue
		}
		out = append(out, r)
	}
	return out
}

// egressPlan is what a sandbox's policy becomes in the kernel: address ranges open on every port, and ranges
// open on one port (TCP and UDP).
type egressPlan struct {
	custom bool
	any    []ipRange
	ports  map[uint16][]ipRange
}

// plan turns rules into merged ranges. resolve gives a hostname's current addresses; resolvers are the DNS
// servers a list with a hostname in it may query on port 53.
func plan(rules []EgressRule, resolve func(string) []netip.Addr, resolvers []netip.Addr) egressPlan {
	if rules == nil {
		return egressPlan{}
	}
	p := egressPlan{custom: true, ports: map[uint16][]ipRange{}}
	hasHost := false
	for _, r := range rules {
		var rs []ipRange
		if r.Host != "" {
			hasHost = true
			for _, a := range resolve(r.Host) {
				if a.Is4() {
					rs = append(rs, ipRange{addrU32(a), addrU32(a)})
				}
			}
		} else {
			rs = append(rs, prefixRange(r.Net))
		}
		if r.Port == 0 {
			p.any = append(p.any, rs...)
		} else {
			p.ports[r.Port] = append(p.ports[r.Port], rs...)
		}
	}
	if hasHost {
		for _, a := range resolvers {
			p.ports[53] = append(p.ports[53], ipRange{addrU32(a), addrU32(a)})
		}
	}
	p.any = mergeRanges(p.any)
	for port, rs := range p.ports {
		p.ports[port] = mergeRanges(rs)
	}
	return p
}

// hosts lists the hostnames of rules.
func hosts(rules []EgressRule) []string {
	var hs []string
	for _, r := range rules {
		if r.Host != "" {
			hs = append(hs, r.Host)
		}
	}
	return hs
}
