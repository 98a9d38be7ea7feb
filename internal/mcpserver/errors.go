package mcpserver

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"

	"github.com/ramify-dev/ramify/client"
)

// explain turns an error of the client into the message a model can act on. ids are the sandbox ids the call
// named, in the order the server checks them.
func (t *tools) explain(err error, ids ...string) error {
	var ae *client.APIError
	switch {
	case errors.As(err, &ae) && ae.StatusCode == http.StatusNotFound && ae.Message == "sandbox not found":
		// An id merged away or destroyed gets the server's own account of it ("was merged into ..."); this is an
		// id the server never knew or has forgotten.
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
