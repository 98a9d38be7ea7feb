package mcpserver

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"sync"

	"github.com/ramify-dev/ramify/client"
)

// lineage remembers what this MCP server did to sandbox ids, to explain an id the server no longer knows: the
// ramify server forgets a merged winner's id entirely (GET answers "sandbox not found", as for a destroyed or
// mistyped id), so only the MCP server, which made the merge, can say where its state went.
type lineage struct {
	mu        sync.Mutex
	mergedTo  map[string]string // winner -> parent, for merges made through this server
	destroyed map[string]bool   // ids destroyed through this server
}

func (l *lineage) merged(winner, parent string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.mergedTo == nil {
		l.mergedTo = map[string]string{}
	}
	l.mergedTo[winner] = parent
}

func (l *lineage) destroy(id string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.destroyed == nil {
		l.destroyed = map[string]bool{}
	}
	l.destroyed[id] = true
}

// whatBecameOf says what this server knows about a gone id ("" if nothing). A parent that was itself merged
// away later is followed to the id that holds the state now.
func (l *lineage) whatBecameOf(id string) string {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.destroyed[id] {
		return fmt.Sprintf("sandbox %s was destroyed (destroy_sandbox)", id)
	}
	parent, ok := l.mergedTo[id]
	if !ok {
		return ""
	}
	for seen := map[string]bool{id: true}; !seen[parent]; {
		seen[parent] = true
		next, ok := l.mergedTo[parent]
		if !ok {
			break
		}
		parent = next
	}
	if l.destroyed[parent] {
		return fmt.Sprintf("sandbox %s was merged into %s (merge_into), which has since been destroyed", id, parent)
	}
	return fmt.Sprintf("sandbox %s was merged into %s (merge_into): its id is retired and its state lives on as %s; use id %s", id, parent, parent, parent)
}

// explain turns an error of the client into the message a model can act on. ids are the sandbox ids the call
// named, in the order the server checks them.
func (t *tools) explain(err error, ids ...string) error {
	var ae *client.APIError
	switch {
	case errors.As(err, &ae) && ae.StatusCode == http.StatusNotFound && ae.Message == "sandbox not found":
		for _, id := range ids {
			if what := t.gone.whatBecameOf(id); what != "" {
				return fmt.Errorf("%s (the server answered: %w)", what, err)
			}
		}
		return fmt.Errorf("%w: %s is not a sandbox of this server. It was destroyed, timed out, or was the winner of a merge_into "+
			"(a merged winner's id is retired: its state lives on under the parent's id), or it never existed; "+
			"list_sandboxes shows the live ones", err, strings.Join(ids, " or "))
	case errors.As(err, &ae) && ae.StatusCode == http.StatusUnauthorized:
		return fmt.Errorf("%w: the server at %s refused the API key: set RAMIFY_API_KEY in the MCP server's environment "+
			"to the key the server printed at its first start (saved in its data directory as api-key, /var/lib/ramify/api-key by default)",
			err, t.c.BaseURL())
	case ae == nil && unreachable(err):
		return fmt.Errorf("cannot reach the ramify server at %s (%w). Start one on this machine with `ramify serve` "+
			"(or `make run` in the ramify repository), or point RAMIFY_API_URL (and RAMIFY_API_KEY) in the MCP server's "+
			"environment at a running server", t.c.BaseURL(), err)
	}
	return err
}

// unreachable reports whether err is a failure to connect to the server (refused, no route, unknown host), as
// opposed to an answer of the server or a cancelled call.
func unreachable(err error) bool {
	var op *net.OpError
	var dns *net.DNSError
	return (errors.As(err, &op) && op.Op == "dial") || errors.As(err, &dns)
}
