// Package network owns the sandboxes' host-side networking: the host bridge (with the gateway address), IPv4
// forwarding, the nftables table "ramify" that NATs the sandboxes' outbound traffic, the allocation of sandbox
// addresses from the configured CIDR, and the veth pair that connects each sandbox's network namespace to the
// bridge. It does not create or destroy network namespaces; callers hand it an open namespace file descriptor.
package network

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/netip"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/google/nftables"
	"github.com/ramify-dev/ramify/internal/errdefs"
	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netns"
	"golang.org/x/sys/unix"
)

// Defaults used when Config fields are empty.
const (
	DefaultBridge = "ramify0"
	DefaultCIDR   = "10.213.0.0/16"
)

// TableName is the prefix of the nftables table (family ip) that New owns: the table of bridge B is
// TableName + "_" + B, so servers with different bridges never touch each other's rules. New replaces the
// table's whole contents.
const TableName = "ramify"

// SandboxIfName is the name of the sandbox's interface inside its network namespace.
const SandboxIfName = "eth0"

const ipForwardPath = "/proc/sys/net/ipv4/ip_forward"

// Config configures a Manager. Zero values take the defaults.
type Config struct {
	// Bridge is the host bridge the sandboxes' veths attach to (default "ramify0").
	Bridge string
	// CIDR is the IPv4 network sandboxes get addresses from (default "10.213.0.0/16"). Its first host address is
	// the gateway, assigned to the bridge. The prefix must be /30 or shorter.
	CIDR string

	// EgressAllow lists IPv4 networks (CIDRs or addresses) every sandbox with the default policy may reach even
	// though they are reserved ranges, addresses of the host or networks the host is connected to (server flag
	// --egress-allow).
	EgressAllow []string
	// Resolvers are the DNS servers sandboxes may query on port 53 (UDP and TCP) under the default policy and
	// under an egress list that names a hostname (see ResolversFrom). Nil means the nameservers of the host's
	// /etc/resolv.conf (the default image's resolv.conf is a copy of it); loopback addresses are left out
	// (unreachable from a sandbox).
	Resolvers []netip.Addr
	// ResolveEvery is how often hostnames in egress lists are resolved again (default 60 s).
	ResolveEvery time.Duration
	// Owner, when set, marks this server's host veths (their interface alias is "ramify:" + Owner), so that
	// Reclaim removes only this server's leftovers (serve passes a digest of its data directory).
	Owner string

	// lookup resolves a hostname (tests only; default net.DefaultResolver).
	lookup func(ctx context.Context, host string) ([]netip.Addr, error)
	// table overrides TableName (tests only).
	table string
	// afterCreate, when set, runs in Attach right after the veth pair is created (tests only).
	afterCreate func() error
}

// Manager owns the bridge, the NAT rules and address allocation. It is safe for concurrent use.
type Manager struct {
	log    *slog.Logger
	bridge string
	table  string
	pool   *pool
	alias  string // the alias of this server's host veths ("" when Config.Owner is empty)

	afterCreate func() error

	mu sync.Mutex // guards Allocate's cursor

	nftMu     sync.Mutex // serialises batches on nft and guards ports and names
	nft       *nftables.Conn
	sets      nftSets
	policy    nftPolicy // what the tables hold besides the ports' elements (guard puts them back)
	resolvers []netip.Addr
	ports     map[string]*port // by host veth
	namesMu   sync.Mutex
	names     map[string]*resolved
	every     time.Duration
	lookup    func(ctx context.Context, host string) ([]netip.Addr, error)
	stop      chan struct{}
	done      chan struct{}
	bg        sync.WaitGroup // conntrack clean-ups of detached ports
	forget    flowForgetter  // addresses of detached ports whose flows are to be forgotten
}

// port is a sandbox's bridge port as the kernel has it: its pin and the elements of its egress policy.
type port struct {
	veth   string
	ip     netip.Addr
	rules  []EgressRule // nil: the default policy (or unknown, for a port found at start)
	pin    nftables.SetElement
	custom bool
	anyE   []nftables.SetElement
	portE  []nftables.SetElement
}

// resolved is a hostname's last known addresses.
type resolved struct {
	addrs []netip.Addr
	at    time.Time
}

// New makes sure the bridge exists, carries the gateway address and is up, that IPv4 forwarding is enabled and
// that the bridge's nftables table (TableName_<bridge>) holds exactly the NAT and forward rules for cfg. It is idempotent: running it
// again (for example after a restart) converges to the same state without duplicating addresses, tables, chains or
// rules.
func New(ctx context.Context, cfg Config, log *slog.Logger) (*Manager, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	if cfg.Bridge == "" {
		cfg.Bridge = DefaultBridge
	}
	if cfg.CIDR == "" {
		cfg.CIDR = DefaultCIDR
	}
	if err := validIfName(cfg.Bridge); err != nil {
		return nil, fmt.Errorf("network: bridge: %w", err)
	}
	p, err := newPool(cfg.CIDR)
	if err != nil {
		return nil, fmt.Errorf("network: %w", err)
	}
	if cfg.table == "" {
		cfg.table = TableName + "_" + cfg.Bridge
	}
	opened := make([]netip.Prefix, 0, len(cfg.EgressAllow))
	for _, a := range cfg.EgressAllow {
		r, err := ParseEgressEntry(a)
		if err != nil || r.Host != "" || r.Port != 0 {
			return nil, errdefs.New(errdefs.ErrInvalid, fmt.Sprintf("network: egress-allow %q: want an IPv4 CIDR or address", a))
		}
		opened = append(opened, r.Net)
	}
	if cfg.Resolvers == nil {
		cfg.Resolvers = hostResolvers("/etc/resolv.conf")
	}
	if cfg.ResolveEvery <= 0 {
		cfg.ResolveEvery = 60 * time.Second
	}
	if cfg.lookup == nil {
		cfg.lookup = func(ctx context.Context, host string) ([]netip.Addr, error) {
			return net.DefaultResolver.LookupNetIP(ctx, "ip4", host)
		}
	}
	m := &Manager{log: log.With("component", "network"), bridge: cfg.Bridge, table: cfg.table, pool: p, alias: aliasOf(cfg.Owner),
		afterCreate: cfg.afterCreate, resolvers: cfg.Resolvers, ports: map[string]*port{},
		names: map[string]*resolved{}, every: cfg.ResolveEvery, lookup: cfg.lookup, stop: make(chan struct{}), done: make(chan struct{})}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if err := m.ensureBridge(); err != nil {
		return nil, fmt.Errorf("network: bridge %s: %w", cfg.Bridge, err)
	}
	if err := enableForwarding(); err != nil {
		return nil, fmt.Errorf("network: enable ip forwarding: %w", err)
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	if err := m.initNFT(opened); err != nil {
		return nil, fmt.Errorf("network: nftables table %s: %w", cfg.table, err)
	}
	if n := m.policy.hostNets; len(n) > 0 {
		m.log.Info("the host's own networks are refused to default sandboxes (open them with --egress-allow)", "networks", n)
	}
	go m.refreshLoop(cfg.ResolveEvery)
	m.log.Debug("network ready", "bridge", cfg.Bridge, "cidr", p.network.String(), "gateway", p.gateway().String(),
		"resolvers", cfg.Resolvers, "egress_allow", cfg.EgressAllow)
	return m, nil
}

// Gateway returns the gateway address (the first host address of the CIDR, assigned to the bridge).
func (m *Manager) Gateway() net.IP { return m.pool.gateway() }

// Prefix returns the CIDR's prefix length.
func (m *Manager) Prefix() int { return m.pool.prefix }

// Bridge returns the bridge's name.
func (m *Manager) Bridge() string { return m.bridge }

// Allocate returns a free address in the CIDR: never the network, gateway or broadcast address, and never one for
// which inUse reports true (inUse may be nil). It hands addresses out round-robin, starting after the previously
// returned one, so that a just-released address is not immediately reused, and never one whose previous owner's
// flows are still to be forgotten (see flowForgetter). When no address is free it returns an error matching
// errdefs.ErrConflict.
func (m *Manager) Allocate(inUse func(net.IP) bool) (net.IP, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.pool.allocate(func(ip net.IP) bool {
		if a, ok := netip.AddrFromSlice(ip.To4()); ok && m.forget.forgetting(a) {
			return true // a destroyed sandbox's flows are still in conntrack
		}
		return inUse != nil && inUse(ip)
	})
}

// Attach connects the network namespace open at nsFD (for example /proc/<pid>/ns/net) to the bridge: it creates
// the veth pair hostVeth <-> eth0 with eth0 inside the namespace, gives eth0 ip with the CIDR's prefix, brings it
// and the namespace's loopback up, adds a default route via the gateway, and attaches hostVeth to the bridge and
// brings it up. Before the port comes up, one nftables batch pins the port to eth0's MAC (MACFor(ip)) and ip and
// installs the sandbox's egress policy (egress as in ParseEgress: nil is the default policy). On failure it deletes
// the veth pair and the elements it created. ip must be a host address of the CIDR other than the gateway
// (errdefs.ErrInvalid otherwise); an existing hostVeth is errdefs.ErrConflict.
func (m *Manager) Attach(ctx context.Context, nsFD int, ip net.IP, hostVeth string, egress []string) (err error) {
	if err := validIfName(hostVeth); err != nil {
		return fmt.Errorf("attach %s: %w", hostVeth, err)
	}
	ip4, rules, err := m.attachArgs(hostVeth, nsFD, ip, egress)
	if err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("attach %s: %w", hostVeth, err)
	}
	mac := MACFor(ip4)
	host, br, err := m.addPair("attach", nsFD, hostVeth, mac)
	if err != nil {
		return err
	}
	defer m.detachOnError("attach", hostVeth, &err)

	if m.afterCreate != nil {
		if err := m.afterCreate(); err != nil {
			return fmt.Errorf("attach %s: %w", hostVeth, err)
		}
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("attach %s: %w", hostVeth, err)
	}
	addr, _ := netip.AddrFromSlice(ip4)
	if err := m.setPort(ctx, hostVeth, addr, mac, rules); err != nil {
		return fmt.Errorf("attach %s: %w", hostVeth, err)
	}
	if err := configureInside(nsFD, ip4, m.pool.prefix, m.pool.gateway(), nil, true); err != nil {
		return fmt.Errorf("attach %s: %w", hostVeth, err)
	}

	if err := m.joinBridge("attach", host, br); err != nil {
		return err
	}
	if err := netlink.LinkSetUp(host); err != nil {
		return fmt.Errorf("attach %s: set up: %w", hostVeth, err)
	}
	m.log.Debug("attached", "veth", hostVeth, "ip", ip4.String())
	return nil
}

// addPair creates the veth pair hostVeth <-> eth0 with the bridge's MTU, eth0 directly inside the namespace open
// at nsFD (with MAC mac, unless nil), and returns the host side and the bridge. The peer is created already named
// eth0 in its namespace: there is no moment at which a temporary name could clash with another sandbox's in the
// host namespace. An existing hostVeth is errdefs.ErrConflict. op ("attach", "prepare") starts its errors.
func (m *Manager) addPair(op string, nsFD int, hostVeth string, mac net.HardwareAddr) (*netlink.Veth, netlink.Link, error) {
	br, err := netlink.LinkByName(m.bridge)
	if err != nil {
		return nil, nil, fmt.Errorf("%s %s: bridge %s: %w", op, hostVeth, m.bridge, err)
	}
	veth := &netlink.Veth{
		LinkAttrs:        netlink.LinkAttrs{Name: hostVeth, MTU: br.Attrs().MTU},
		PeerName:         SandboxIfName,
		PeerNamespace:    netlink.NsFd(nsFD),
		PeerHardwareAddr: mac,
	}
	if err := netlink.LinkAdd(veth); err != nil {
		if errors.Is(err, unix.EEXIST) {
			return nil, nil, fmt.Errorf("%s %s: create veth: %w", op, hostVeth, errdefs.ErrConflict)
		}
		return nil, nil, fmt.Errorf("%s %s: create veth: %w", op, hostVeth, err)
	}
	return veth, br, nil
}

// detachOnError removes the pair hostVeth that op (Attach, Prepare) made, if op is failing (*err is set): on
// failure nothing of it is left.
func (m *Manager) detachOnError(op, hostVeth string, err *error) {
	if *err == nil {
		return
	}
	if derr := m.Detach(hostVeth); derr != nil {
		m.log.Warn(op+" cleanup failed", "veth", hostVeth, "err", derr)
	}
}

// joinBridge marks host (a veth's host side) with the server's alias, puts it on the bridge br and isolates the
// port: an isolated bridge port forwards only to non-isolated ports (the bridge itself), so sandboxes cannot
// reach each other at L2. It leaves the port down. op starts its errors.
func (m *Manager) joinBridge(op string, host, br netlink.Link) error {
	name := host.Attrs().Name
	if m.alias != "" {
		if err := netlink.LinkSetAlias(host, m.alias); err != nil {
			return fmt.Errorf("%s %s: set alias: %w", op, name, err)
		}
	}
	if err := netlink.LinkSetMaster(host, br); err != nil {
		return fmt.Errorf("%s %s: set master %s: %w", op, name, m.bridge, err)
	}
	if err := netlink.LinkSetIsolated(host, true); err != nil {
		return fmt.Errorf("%s %s: isolate port: %w", op, name, err)
	}
	return nil
}

// attachArgs checks Attach's and AttachPrepared's arguments but the names, and returns ip as 4 bytes and the
// parsed egress rules.
func (m *Manager) attachArgs(hostVeth string, nsFD int, ip net.IP, egress []string) (net.IP, []EgressRule, error) {
	rules, err := ParseEgress(egress)
	if err != nil {
		return nil, nil, fmt.Errorf("attach %s: %w", hostVeth, err)
	}
	ip4 := ip.To4()
	if ip4 == nil || !m.pool.isHost(ip4) || ip4.Equal(m.pool.gateway()) {
		return nil, nil, fmt.Errorf("attach %s: address %v: %w", hostVeth, ip,
			errdefs.New(errdefs.ErrInvalid, fmt.Sprintf("address %v is not a usable address of %s", ip, m.pool.network)))
	}
	if nsFD < 0 {
		return nil, nil, fmt.Errorf("attach %s: namespace fd %d: %w", hostVeth, nsFD, errdefs.ErrInvalid)
	}
	return ip4, rules, nil
}

// configureInside sets up eth0 (its MAC first, when mac is not nil) and, unless loUp is false, lo inside the
// namespace open at nsFD.
func configureInside(nsFD int, ip net.IP, prefix int, gw net.IP, mac net.HardwareAddr, loUp bool) error {
	h, err := netlink.NewHandleAt(netns.NsHandle(nsFD), unix.NETLINK_ROUTE)
	if err != nil {
		return fmt.Errorf("netlink handle in namespace: %w", err)
	}
	defer h.Close()

	if loUp {
		if err := upLoopback(h); err != nil {
			return err
		}
	}
	eth, err := h.LinkByName(SandboxIfName)
	if err != nil {
		return fmt.Errorf("namespace %s: %w", SandboxIfName, err)
	}
	if mac != nil {
		if err := h.LinkSetHardwareAddr(eth, mac); err != nil {
			return fmt.Errorf("namespace %s MAC %s: %w", SandboxIfName, mac, err)
		}
	}
	addr := &netlink.Addr{IPNet: &net.IPNet{IP: ip, Mask: net.CIDRMask(prefix, 32)}}
	if err := h.AddrAdd(eth, addr); err != nil {
		return fmt.Errorf("namespace %s address %s: %w", SandboxIfName, addr.IPNet, err)
	}
	if err := h.LinkSetUp(eth); err != nil {
		return fmt.Errorf("namespace %s up: %w", SandboxIfName, err)
	}
	route := &netlink.Route{LinkIndex: eth.Attrs().Index, Gw: gw, Family: netlink.FAMILY_V4}
	if err := h.RouteReplace(route); err != nil {
		return fmt.Errorf("namespace default route via %s: %w", gw, err)
	}
	return nil
}

// upLoopback brings up lo in the namespace h works in.
func upLoopback(h *netlink.Handle) error {
	lo, err := h.LinkByName("lo")
	if err != nil {
		return fmt.Errorf("namespace lo: %w", err)
	}
	if err := h.LinkSetUp(lo); err != nil {
		return fmt.Errorf("namespace lo up: %w", err)
	}
	return nil
}

// SparePortName is the host-side name of a port prepared (Prepare) ahead of its sandbox, for the namespace that
// key names: "rfs" and 12 hex digits of a SHA-256 of key.
func SparePortName(key string) string {
	sum := sha256.Sum256([]byte(key))
	return "rfs" + hex.EncodeToString(sum[:6])
}

// Prepare makes a port ahead of the sandbox that will own the network namespace open at nsFD, off the path of
// the fork or create that claims it (AttachPrepared): the veth pair hostVeth <-> eth0 (inside, down, no address),
// hostVeth marked with the server's alias, on the bridge, isolated and down, and lo up inside. A prepared port
// carries nothing: neither end is up, and it has no pin. It goes with the namespace, or with Detach(hostVeth). On
// failure nothing is left.
func (m *Manager) Prepare(ctx context.Context, nsFD int, hostVeth string) (err error) {
	if err := validIfName(hostVeth); err != nil {
		return fmt.Errorf("prepare %s: %w", hostVeth, err)
	}
	if nsFD < 0 {
		return fmt.Errorf("prepare %s: namespace fd %d: %w", hostVeth, nsFD, errdefs.ErrInvalid)
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("prepare %s: %w", hostVeth, err)
	}
	veth, br, err := m.addPair("prepare", nsFD, hostVeth, nil)
	if err != nil {
		return err
	}
	defer m.detachOnError("prepare", hostVeth, &err)
	if err := m.joinBridge("prepare", veth, br); err != nil {
		return err
	}
	h, err := netlink.NewHandleAt(netns.NsHandle(nsFD), unix.NETLINK_ROUTE)
	if err != nil {
		return fmt.Errorf("prepare %s: netlink handle in namespace: %w", hostVeth, err)
	}
	defer h.Close()
	if err := upLoopback(h); err != nil {
		return fmt.Errorf("prepare %s: %w", hostVeth, err)
	}
	return nil
}

// AttachPrepared gives the port Prepare made as prepared, for the namespace open at nsFD, to a sandbox: as
// Attach, with less to do on the claim's path. The port is renamed hostVeth, pinned and given its egress policy,
// eth0 gets MACFor(ip), ip and the default route, and both ends come up. A prepared port that is not this
// server's, or is up, is refused (errdefs.ErrConflict); one that is gone is errdefs.ErrNotFound. On failure the
// pair is deleted: the namespace can be attached afresh with Attach.
func (m *Manager) AttachPrepared(ctx context.Context, nsFD int, prepared string, ip net.IP, hostVeth string, egress []string) (err error) {
	for _, name := range []string{prepared, hostVeth} {
		if err := validIfName(name); err != nil {
			return fmt.Errorf("attach %s: %w", hostVeth, err)
		}
	}
	ip4, rules, err := m.attachArgs(hostVeth, nsFD, ip, egress)
	if err != nil {
		return err
	}
	host, err := netlink.LinkByName(prepared)
	if err != nil {
		var nf netlink.LinkNotFoundError
		if errors.As(err, &nf) {
			err = errdefs.ErrNotFound
		}
		return fmt.Errorf("attach %s: prepared port %s: %w", hostVeth, prepared, err)
	}
	if host.Type() != "veth" || host.Attrs().Alias != m.alias || host.Attrs().Flags&net.FlagUp != 0 {
		return fmt.Errorf("attach %s: %s is not a prepared port of this server: %w", hostVeth, prepared, errdefs.ErrConflict)
	}
	defer func() {
		if err != nil {
			m.dropPort(hostVeth) //nolint:errcheck // logged by Detach's callers; nothing else to do
			if derr := netlink.LinkDel(host); derr != nil && !errors.Is(derr, unix.ENODEV) {
				m.log.Warn("attach cleanup failed", "veth", hostVeth, "err", derr)
			}
		}
	}()
	if err := netlink.LinkSetName(host, hostVeth); err != nil {
		if errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("attach %s: rename %s: %w", hostVeth, prepared, errdefs.ErrConflict)
		}
		return fmt.Errorf("attach %s: rename %s: %w", hostVeth, prepared, err)
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("attach %s: %w", hostVeth, err)
	}
	mac := MACFor(ip4)
	addr, _ := netip.AddrFromSlice(ip4)
	if err := m.setPort(ctx, hostVeth, addr, mac, rules); err != nil {
		return fmt.Errorf("attach %s: %w", hostVeth, err)
	}
	if err := configureInside(nsFD, ip4, m.pool.prefix, m.pool.gateway(), mac, false); err != nil {
		return fmt.Errorf("attach %s: %w", hostVeth, err)
	}
	if err := netlink.LinkSetUp(host); err != nil {
		return fmt.Errorf("attach %s: set up: %w", hostVeth, err)
	}
	m.log.Debug("attached", "veth", hostVeth, "ip", ip4.String(), "prepared", prepared)
	return nil
}

// Detach removes the port's pin and egress elements (one nftables batch) and deletes the host veth (and with it
// its peer inside the sandbox's namespace). A veth that does not exist is not an error.
func (m *Manager) Detach(hostVeth string) error {
	if err := validIfName(hostVeth); err != nil {
		return fmt.Errorf("detach %s: %w", hostVeth, err)
	}
	if err := m.dropPort(hostVeth); err != nil {
		m.log.Warn("detach: remove nftables elements", "veth", hostVeth, "err", err)
	}
	l, err := netlink.LinkByName(hostVeth)
	if err != nil {
		var nf netlink.LinkNotFoundError
		if errors.As(err, &nf) {
			return nil
		}
		return fmt.Errorf("detach %s: %w", hostVeth, err)
	}
	if err := netlink.LinkDel(l); err != nil {
		if errors.Is(err, unix.ENODEV) {
			return nil
		}
		return fmt.Errorf("detach %s: %w", hostVeth, err)
	}
	return nil
}

// Close releases the Manager. It leaves the bridge, forwarding and NAT rules (and the running sandboxes' pins and
// policies) in place for the next start.
func (m *Manager) Close() error {
	select {
	case <-m.stop:
	default:
		close(m.stop)
	}
	<-m.done
	m.bg.Wait()
	m.nftMu.Lock()
	defer m.nftMu.Unlock()
	if m.nft != nil {
		err := m.nft.CloseLasting()
		m.nft = nil
		return err
	}
	return nil
}

// MACFor is the MAC address a sandbox with address ip gets on its eth0: 02:52 (locally administered) and the
// four bytes of the address, so the host knows it before the interface exists.
func MACFor(ip net.IP) net.HardwareAddr {
	ip4 := ip.To4()
	return net.HardwareAddr{0x02, 0x52, ip4[0], ip4[1], ip4[2], ip4[3]}
}

// VethName returns the host-side veth name for a sandbox: "rfy" followed by 12 hex characters. When the id's part
// after its last '_' (the whole id if it has none) is at least 12 hex digits, they are its first 12 (so the name can
// be recognised from the id); otherwise they come from a SHA-256 of the id. The result is deterministic and at most
// 15 characters (the kernel's interface name limit).
func VethName(sandboxID string) string {
	s := strings.ToLower(sandboxID[strings.LastIndexByte(sandboxID, '_')+1:])
	if len(s) >= 12 && isHex(s) {
		return "rfy" + s[:12]
	}
	sum := sha256.Sum256([]byte(sandboxID))
	return "rfy" + hex.EncodeToString(sum[:6])
}

func isHex(s string) bool {
	for _, c := range s {
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}

// validIfName checks a Linux interface name: 1-15 bytes, no '/', whitespace or ':', not "." or "..".
func validIfName(name string) error {
	if name == "" || len(name) > 15 || name == "." || name == ".." ||
		strings.ContainsAny(name, "/: \t\n\x00") {
		return errdefs.New(errdefs.ErrInvalid, fmt.Sprintf("invalid interface name %q", name))
	}
	return nil
}

// ensureBridge creates the bridge if missing, assigns the gateway address unless present, and brings it up.
func (m *Manager) ensureBridge() error {
	link, err := netlink.LinkByName(m.bridge)
	if err != nil {
		var nf netlink.LinkNotFoundError
		if !errors.As(err, &nf) {
			return err
		}
		br := &netlink.Bridge{LinkAttrs: netlink.LinkAttrs{Name: m.bridge}}
		if err := netlink.LinkAdd(br); err != nil && !errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("create: %w", err)
		}
		if link, err = netlink.LinkByName(m.bridge); err != nil {
			return err
		}
		m.log.Info("created bridge", "bridge", m.bridge)
	}
	if link.Type() != "bridge" {
		return fmt.Errorf("%s exists and is a %s, not a bridge: %w", m.bridge, link.Type(), errdefs.ErrConflict)
	}
	want := &net.IPNet{IP: m.pool.gateway(), Mask: net.CIDRMask(m.pool.prefix, 32)}
	addrs, err := linkAddrs(link)
	if err != nil {
		return fmt.Errorf("list addresses: %w", err)
	}
	have := false
	for _, a := range addrs {
		if a.IPNet == nil {
			continue
		}
		ones, _ := a.Mask.Size()
		switch {
		case a.IP.Equal(want.IP) && ones == m.pool.prefix:
			have = true
		case a.IP.Equal(want.IP):
			// The gateway address with a stale prefix (the CIDR changed): replace it.
			if err := netlink.AddrDel(link, &a); err != nil {
				return fmt.Errorf("remove stale address %s: %w", a.IPNet, err)
			}
		default:
			m.log.Warn("bridge has an unexpected address; leaving it", "bridge", m.bridge, "addr", a.IPNet.String())
		}
	}
	if !have {
		if err := netlink.AddrAdd(link, &netlink.Addr{IPNet: want}); err != nil && !errors.Is(err, unix.EEXIST) {
			return fmt.Errorf("add address %s: %w", want, err)
		}
	}
	// A bridge without an address of its own takes the lowest MAC of its ports, so it changes whenever a
	// sandbox's veth comes or goes, and every sandbox's cached gateway MAC goes stale (their traffic is lost until
	// their ARP entry expires). A fixed address keeps the gateway's MAC stable.
	if mac := MACFor(m.pool.gateway()); link.Attrs().HardwareAddr.String() != mac.String() {
		if err := netlink.LinkSetHardwareAddr(link, mac); err != nil {
			return fmt.Errorf("set MAC %s: %w", mac, err)
		}
	}
	if err := netlink.LinkSetUp(link); err != nil {
		return fmt.Errorf("set up: %w", err)
	}
	return nil
}

func enableForwarding() error {
	b, err := os.ReadFile(ipForwardPath)
	if err == nil && strings.TrimSpace(string(b)) == "1" {
		return nil
	}
	return os.WriteFile(ipForwardPath, []byte("1\n"), 0o644)
}

// pool is the address arithmetic for one IPv4 CIDR. Addresses are handled as uint32.
type pool struct {
	network *net.IPNet
	prefix  int
	base    uint32 // network address
	size    uint64 // number of addresses in the CIDR, including network and broadcast
	cursor  uint32 // last offset handed out by allocate (0 = none yet)
}

func newPool(cidr string) (*pool, error) {
	_, n, err := net.ParseCIDR(cidr)
	if err != nil {
		return nil, errdefs.New(errdefs.ErrInvalid, fmt.Sprintf("invalid CIDR %q", cidr))
	}
	ones, bits := n.Mask.Size()
	if bits != 32 || n.IP.To4() == nil {
		return nil, errdefs.New(errdefs.ErrInvalid, fmt.Sprintf("CIDR %q is not IPv4", cidr))
	}
	if ones > 30 || ones < 1 {
		return nil, errdefs.New(errdefs.ErrInvalid, fmt.Sprintf("CIDR %q: prefix must be between /1 and /30", cidr))
	}
	n.IP = n.IP.To4()
	return &pool{network: n, prefix: ones, base: binary.BigEndian.Uint32(n.IP), size: 1 << (32 - ones)}, nil
}

func u32ToIP(v uint32) net.IP {
	ip := make(net.IP, 4)
	binary.BigEndian.PutUint32(ip, v)
	return ip
}

// gateway is the first host address.
func (p *pool) gateway() net.IP { return u32ToIP(p.base + 1) }

// broadcast is the last address.
func (p *pool) broadcast() net.IP { return u32ToIP(p.base + uint32(p.size-1)) }

// isHost reports whether ip is inside the CIDR and neither its network nor its broadcast address.
func (p *pool) isHost(ip net.IP) bool {
	ip4 := ip.To4()
	if ip4 == nil || !p.network.Contains(ip4) {
		return false
	}
	off := uint64(binary.BigEndian.Uint32(ip4) - p.base)
	return off != 0 && off != p.size-1
}

// allocate scans the assignable offsets 2..size-2 round-robin from just after the cursor.
func (p *pool) allocate(inUse func(net.IP) bool) (net.IP, error) {
	first, last := uint64(2), p.size-2 // offset 1 is the gateway
	if last < first {
		return nil, errdefs.New(errdefs.ErrConflict, "address pool exhausted")
	}
	n := last - first + 1
	start := uint64(p.cursor) + 1
	if start < first || start > last {
		start = first
	}
	for i := uint64(0); i < n; i++ {
		off := start + i
		if off > last {
			off -= n
		}
		ip := u32ToIP(p.base + uint32(off))
		if inUse != nil && inUse(ip) {
			continue
		}
		p.cursor = uint32(off)
		return ip, nil
	}
	return nil, fmt.Errorf("allocate in %s: %w", p.network, errdefs.New(errdefs.ErrConflict, "address pool exhausted"))
}
