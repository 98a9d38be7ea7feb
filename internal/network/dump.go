package network

import (
	"errors"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
)

// dumpAttempts bounds how often a netlink dump interrupted by a concurrent change (NLM_F_DUMP_INTR: another
// server or sandbox adding or removing a link meanwhile) is started again before its error is returned.
const dumpAttempts = 20

// retryDump runs dump until it completes without interruption: an interrupted dump may miss or repeat entries,
// and a reclaim working from one would leave ports behind (a conntrack walk, flows unforgotten).
func retryDump[T any](dump func() (T, error)) (T, error) {
	var (
		out T
		err error
	)
	for range dumpAttempts {
		if out, err = dump(); !errors.Is(err, nl.ErrDumpInterrupted) {
			return out, err
		}
	}
	return out, err
}

// Links lists the host's network links with a dump that was not interrupted by a concurrent change.
func Links() ([]netlink.Link, error) { return retryDump(netlink.LinkList) }

// linkAddrs lists link's IPv4 addresses the same way.
func linkAddrs(link netlink.Link) ([]netlink.Addr, error) {
	return retryDump(func() ([]netlink.Addr, error) { return netlink.AddrList(link, netlink.FAMILY_V4) })
}
