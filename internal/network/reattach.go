package network

import (
	"context"
	"fmt"
	"net"

	"github.com/vishvananda/netlink"
)

// MissingPorts lists the host veths of attached sandboxes that the host no longer has: deleted behind the
// server's back (`ip link del`, a network manager on the host), which takes the sandbox's eth0 with it. Its
// nftables elements are the manager's and are still in place. One dump of the host's links.
func (m *Manager) MissingPorts() ([]string, error) {
	links, err := Links()
	if err != nil {
		return nil, fmt.Errorf("missing ports: %w", err)
	}
	have := make(map[string]bool, len(links))
	for _, l := range links {
		have[l.Attrs().Name] = true
	}
	m.nftMu.Lock()
	defer m.nftMu.Unlock()
	var out []string
	for veth := range m.ports {
		if !have[veth] {
			out = append(out, veth)
		}
	}
	return out, nil
}

// Reattach makes the veth pair of an attached sandbox whose host veth is gone again, as Attach made it: the pair
// (eth0 inside the namespace open at nsFD, with the MAC its address pins), eth0's address and route, the bridge
// port, isolated and up; the port's nftables elements never left. It does nothing when the port was detached
// meanwhile (a destroy: Detach drops the port before it deletes the veth, and the port is checked under the same
// lock) or when the veth is back. A failure leaves nothing of the new pair.
func (m *Manager) Reattach(ctx context.Context, nsFD int, hostVeth string) (err error) {
	if err := validIfName(hostVeth); err != nil {
		return fmt.Errorf("reattach %s: %w", hostVeth, err)
	}
	m.nftMu.Lock()
	defer m.nftMu.Unlock()
	p := m.ports[hostVeth]
	if p == nil {
		return nil
	}
	if _, err := netlink.LinkByName(hostVeth); err == nil {
		return nil
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("reattach %s: %w", hostVeth, err)
	}
	ip := net.IP(p.ip.AsSlice())
	host, br, err := m.addPair("reattach", nsFD, hostVeth, MACFor(ip))
	if err != nil {
		return err
	}
	defer func() {
		if err != nil {
			netlink.LinkDel(host) //nolint:errcheck // the error says what failed; the next check tries again
		}
	}()
	if err := configureInside(nsFD, ip, m.pool.prefix, m.pool.gateway(), nil, false); err != nil {
		return fmt.Errorf("reattach %s: %w", hostVeth, err)
	}
	if err := m.joinBridge("reattach", host, br); err != nil {
		return err
	}
	if err := netlink.LinkSetUp(host); err != nil {
		return fmt.Errorf("reattach %s: set up: %w", hostVeth, err)
	}
	return nil
}
