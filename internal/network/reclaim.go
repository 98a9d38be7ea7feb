package network

import (
	"errors"
	"fmt"

	"github.com/vishvananda/netlink"
)

// aliasOf is the interface alias that marks the host veths of the server whose Config.Owner is owner.
func aliasOf(owner string) string {
	if owner == "" {
		return ""
	}
	return "ramify:" + owner
}

// Reclaim detaches (Detach: nftables elements, then the veth) every port of this server that keep does not
// claim: host veths on the bridge marked with this server's alias, and ports whose elements the table still
// holds but whose veth is gone or is this server's. A veth without this server's alias (another server's on a
// shared bridge, or one made before veths were marked) is left alone. It returns how many ports it removed.
// Without Config.Owner it does nothing.
func (m *Manager) Reclaim(keep func(veth string) bool) (int, error) {
	if m.alias == "" {
		return 0, nil
	}
	candidates := map[string]bool{}
	var errs []error
	links, err := Links()
	if err != nil {
		// Go on with the ports the table names: a failed listing must not keep those from being detached.
		errs = append(errs, fmt.Errorf("list veths: %w", err))
	}
	for _, l := range links {
		if a := l.Attrs(); a.Alias == m.alias && l.Type() == "veth" {
			candidates[a.Name] = true
		}
	}
	m.nftMu.Lock()
	for veth := range m.ports {
		candidates[veth] = true
	}
	m.nftMu.Unlock()
	n := 0
	for veth := range candidates {
		if keep(veth) {
			continue
		}
		if l, err := netlink.LinkByName(veth); err == nil && l.Attrs().Alias != m.alias {
			continue // exists and is not ours
		}
		if err := m.Detach(veth); err != nil {
			errs = append(errs, err)
			continue
		}
		n++
	}
	return n, errors.Join(errs...)
}
