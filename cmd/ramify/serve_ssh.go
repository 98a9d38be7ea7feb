package main

import (
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/crypto/ssh"

	"github.com/ramify-dev/ramify/internal/sshd"
)

// sshFlags are serve's flags for the SSH server (ssh <sandbox id>@host into a sandbox).
type sshFlags struct {
	listen, host string
	ln           net.Listener
	srv          *sshd.Server
}

func (g *sshFlags) register(fs *flag.FlagSet) {
	fs.StringVar(&g.listen, "ssh-listen", os.Getenv("RAMIFY_SSH_LISTEN"),
		"serve SSH on this address: ssh -p <port> <sandbox id>@<host>, with a key given in the sandbox's ssh_pubkeys (env RAMIFY_SSH_LISTEN)")
	fs.StringVar(&g.host, "ssh-host", os.Getenv("RAMIFY_SSH_HOST"),
		"host name clients use to reach --ssh-listen, shown in the sandboxes' ssh command (default: the listen address's host, or localhost; env RAMIFY_SSH_HOST)")
}

// open binds --ssh-listen, if set, loads or creates the host key in <data-dir>/ssh, and returns the public
// address (host:port) and host key line for the sandbox service, or "" when there is no SSH server.
func (g *sshFlags) open(dataDir string, log *slog.Logger) (addr, hostKey string, err error) {
	if g.listen == "" {
		return "", "", nil
	}
	signer, err := sshd.LoadOrCreateHostKey(filepath.Join(dataDir, "ssh"))
	if err != nil {
		return "", "", err
	}
	ln, err := net.Listen("tcp", g.listen)
	if err != nil {
		return "", "", fmt.Errorf("--ssh-listen: %w", err)
	}
	g.ln = ln
	host, port, _ := net.SplitHostPort(ln.Addr().String())
	if g.host != "" {
		host = g.host
	} else if ip := net.ParseIP(host); ip == nil || ip.IsUnspecified() {
		host = "localhost"
	}
	return net.JoinHostPort(host, port), strings.TrimSpace(string(ssh.MarshalAuthorizedKey(signer.PublicKey()))), nil
}

// serve serves SSH for svc on the listener open bound, if any; the returned function stops it (ending its
// sessions).
func (g *sshFlags) serve(svc sshd.Sandboxes, dataDir string, log *slog.Logger) (func(), error) {
	if g.ln == nil {
		return func() {}, nil
	}
	srv, err := sshd.New(svc, filepath.Join(dataDir, "ssh"), log)
	if err != nil {
		g.ln.Close()
		return nil, err
	}
	go func() {
		if err := srv.Serve(g.ln); err != nil {
			log.Error("ssh listener", "err", err)
		}
	}()
	fmt.Fprintf(os.Stderr, "ssh on %s: ssh -p %s <sandbox id>@<host> (keys from the sandbox's ssh_pubkeys)\n", g.ln.Addr(), portOf(g.ln.Addr()))
	return func() { srv.Close() }, nil
}
