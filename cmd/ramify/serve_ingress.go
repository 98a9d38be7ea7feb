package main

import (
	"flag"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/ramify-dev/ramify/internal/api"
)

// ingressFlags are serve's flags for the ingress listener (HTTP to sandboxes' ports).
type ingressFlags struct {
	listen, domain string
	ln             net.Listener
}

func (g *ingressFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&g.listen, "ingress-listen", os.Getenv("RAMIFY_INGRESS_LISTEN"),
		"serve HTTP to the ports of sandboxes created with ingress_enabled on this address, no API key: Host <port>-<sandbox id without sbx_>.<ingress-domain> (env RAMIFY_INGRESS_LISTEN)")
	fs.StringVar(&g.domain, "ingress-domain", envOr("RAMIFY_INGRESS_DOMAIN", "localhost"),
		"domain of the ingress hosts; the default works on this machine with no DNS set-up, as *.localhost is loopback (env RAMIFY_INGRESS_DOMAIN)")
}

func (g *ingressFlags) validate() error {
	d := strings.TrimSuffix(g.domain, ".")
	if d == "" || strings.ContainsAny(d, "/:@ ") {
		return fmt.Errorf("--ingress-domain %q is not a domain name", g.domain)
	}
	return nil
}

// open binds --ingress-listen, if set, and returns the public host of the ingress URLs ("localhost:7080"), or "".
func (g *ingressFlags) open() (string, error) {
	if g.listen == "" {
		return "", nil
	}
	ln, err := net.Listen("tcp", g.listen)
	if err != nil {
		return "", fmt.Errorf("--ingress-listen: %w", err)
	}
	g.ln = ln
	host := strings.ToLower(strings.TrimSuffix(g.domain, "."))
	if _, port, _ := net.SplitHostPort(ln.Addr().String()); port != "80" {
		host += ":" + port
	}
	return host, nil
}

// serve serves the ingress on the listener open bound, if any; the returned function stops it (and closes its
// proxied connections).
func (g *ingressFlags) serve(srv *api.Server, log *slog.Logger) func() {
	if g.ln == nil {
		return func() {}
	}
	// No WriteTimeout: responses stream, and upgraded connections live as long as their ends want.
	hs := &http.Server{Handler: srv.IngressHandler(g.domain), ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout: 2 * time.Minute}
	go func() {
		if err := hs.Serve(g.ln); err != nil && err != http.ErrServerClosed {
			log.Error("ingress listener", "err", err)
		}
	}()
	fmt.Fprintf(os.Stderr, "ingress (no auth, sandboxes with ingress_enabled) on %s: http://<port>-<sandbox id without sbx_>.%s:%s/\n",
		g.ln.Addr(), g.domain, portOf(g.ln.Addr()))
	return func() { hs.Close() }
}

func portOf(a net.Addr) string {
	_, p, _ := net.SplitHostPort(a.String())
	return p
}
