// Package sshd is ramify's SSH server (`ramify serve --ssh-listen`): it lets `ssh <sandbox-id>@host` into a
// sandbox without an sshd in the image. It owns the server's host key (generated once under the data directory
// and kept), public-key authentication against the sandbox's authorized keys (ssh_pubkeys), and the session
// channel: a shell or a command, with or without a PTY (started in the sandbox by its agent, see
// agent.Session), and the sftp subsystem (which scp uses too), served from the host through the files API so
// that it cannot leave the sandbox's root. Port, agent and X11 forwarding are refused.
package sshd

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/pem"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"sync"
	"time"

	"golang.org/x/crypto/ssh"

	"github.com/ramify-dev/ramify/internal/agent"
	"github.com/ramify-dev/ramify/internal/errdefs"
	"github.com/ramify-dev/ramify/internal/sandbox"
)

// Sandboxes is what the server needs of the sandbox service.
type Sandboxes interface {
	SSHAccess(id string) (sandbox.SSHAccess, error)
	Session(ctx context.Context, id string, r agent.SessionRequest) (*agent.Session, error)
	Files(ctx context.Context, id string) (*sandbox.FileCall, error)
}

// HostKeyFile is the host key's file name under the server's key directory.
const HostKeyFile = "ssh_host_ed25519_key"

// Server serves SSH connections.
type Server struct {
	svc    Sandboxes
	log    *slog.Logger
	config *ssh.ServerConfig
	hostPK ssh.PublicKey

	mu     sync.Mutex
	ln     net.Listener
	conns  map[*ssh.ServerConn]struct{}
	wg     sync.WaitGroup
	closed bool

	// handshakes holds a token per connection not yet authenticated (MaxStartups, in OpenSSH's terms): past
	// maxHandshakes a new connection is closed at once, so that clients that connect and say nothing cannot
	// hold the server's memory and goroutines without bound.
	handshakes chan struct{}
}

// maxHandshakes bounds the connections in handshake or authentication at once.
const maxHandshakes = 64

// New loads (or, the first time, generates) the host key in keyDir and returns a server for svc.
func New(svc Sandboxes, keyDir string, log *slog.Logger) (*Server, error) {
	signer, err := LoadOrCreateHostKey(keyDir)
	if err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &Server{svc: svc, log: log, hostPK: signer.PublicKey(), conns: map[*ssh.ServerConn]struct{}{},
		handshakes: make(chan struct{}, maxHandshakes)}
	s.config = &ssh.ServerConfig{
		PublicKeyCallback: s.authorize,
		BannerCallback:    s.banner,
		ServerVersion:     "SSH-2.0-ramify",
		MaxAuthTries:      6,
	}
	s.config.AddHostKey(signer)
	return s, nil
}

// HostKey is the server's public host key.
func (s *Server) HostKey() ssh.PublicKey { return s.hostPK }

// LoadOrCreateHostKey reads the ed25519 host key in dir, generating it (0600, with its .pub next to it) when
// there is none yet.
func LoadOrCreateHostKey(dir string) (ssh.Signer, error) {
	path := filepath.Join(dir, HostKeyFile)
	b, err := os.ReadFile(path)
	if err == nil {
		signer, err := ssh.ParsePrivateKey(b)
		if err != nil {
			return nil, fmt.Errorf("ssh host key %s: %w", path, err)
		}
		return signer, nil
	}
	if !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("ssh host key: %w", err)
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("ssh host key: %w", err)
	}
	_, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		return nil, err
	}
	block, err := ssh.MarshalPrivateKey(priv, "ramify ssh host key")
	if err != nil {
		return nil, err
	}
	signer, err := ssh.NewSignerFromKey(priv)
	if err != nil {
		return nil, err
	}
	// Written under a temporary name and renamed: a crash never leaves a half key that the next start refuses.
	tmp := path + ".tmp"
	if err := os.WriteFile(tmp, pem.EncodeToMemory(block), 0o600); err != nil {
		return nil, fmt.Errorf("ssh host key: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return nil, fmt.Errorf("ssh host key: %w", err)
	}
	os.WriteFile(path+".pub", ssh.MarshalAuthorizedKey(signer.PublicKey()), 0o644) //nolint:errcheck // informative copy
	return signer, nil
}

// Serve accepts connections on ln until Close.
func (s *Server) Serve(ln net.Listener) error {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return net.ErrClosed
	}
	s.ln = ln
	s.mu.Unlock()
	for {
		c, err := ln.Accept()
		if err != nil {
			s.mu.Lock()
			closed := s.closed
			s.mu.Unlock()
			if closed {
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				time.Sleep(10 * time.Millisecond)
				continue
			}
			return err
		}
		select {
		case s.handshakes <- struct{}{}:
		default:
			s.log.Warn("ssh: too many connections in handshake; closing a new one", "remote", c.RemoteAddr(), "max", maxHandshakes)
			c.Close()
			continue
		}
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			s.handleConn(c)
		}()
	}
}

// Close stops accepting, closes every connection (ending their sessions) and waits for them.
func (s *Server) Close() error {
	s.mu.Lock()
	s.closed = true
	if s.ln != nil {
		s.ln.Close()
	}
	for c := range s.conns {
		c.Close()
	}
	s.mu.Unlock()
	s.wg.Wait()
	return nil
}

// handshakeTimeout bounds a connection's handshake and authentication.
const handshakeTimeout = 30 * time.Second

func (s *Server) handleConn(c net.Conn) {
	c.SetDeadline(time.Now().Add(handshakeTimeout))
	sc, chans, reqs, err := ssh.NewServerConn(c, s.config)
	<-s.handshakes
	if err != nil {
		c.Close()
		s.log.Debug("ssh handshake", "remote", c.RemoteAddr(), "err", err)
		return
	}
	c.SetDeadline(time.Time{})
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		sc.Close()
		return
	}
	s.conns[sc] = struct{}{}
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.conns, sc)
		s.mu.Unlock()
		sc.Close()
	}()
	id := sc.User()
	s.log.Info("ssh connection", "sandbox", id, "remote", c.RemoteAddr(), "key", sc.Permissions.Extensions["fingerprint"])
	go ssh.DiscardRequests(reqs) // global requests (tcpip-forward ...): refused
	var wg sync.WaitGroup
	for nc := range chans {
		if nc.ChannelType() != "session" {
			nc.Reject(ssh.Prohibited, "only sessions are allowed: port forwarding is disabled")
			continue
		}
		if msg := s.unavailable(id); msg != "" {
			nc.Reject(ssh.Prohibited, msg)
			continue
		}
		ch, chReqs, err := nc.Accept()
		if err != nil {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			(&session{srv: s, id: id, ch: ch}).serve(chReqs)
		}()
	}
	wg.Wait()
}

// authorize accepts key if it is one of the sandbox's authorized keys. The sandbox may be paused: the session
// channel then says so (see unavailable).
func (s *Server) authorize(meta ssh.ConnMetadata, key ssh.PublicKey) (*ssh.Permissions, error) {
	acc, err := s.svc.SSHAccess(meta.User())
	if err != nil {
		return nil, fmt.Errorf("sandbox %q: %w", meta.User(), err)
	}
	want := key.Marshal()
	for _, k := range acc.Keys {
		if string(k.Marshal()) == string(want) {
			return &ssh.Permissions{Extensions: map[string]string{"fingerprint": ssh.FingerprintSHA256(key)}}, nil
		}
	}
	return nil, fmt.Errorf("sandbox %q: key %s is not authorized", meta.User(), ssh.FingerprintSHA256(key))
}

// banner tells a client before authentication why it will fail when the user names no sandbox. It says no more
// than that (not what became of the id): the client is not authenticated yet.
func (s *Server) banner(meta ssh.ConnMetadata) string {
	if _, err := s.svc.SSHAccess(meta.User()); err != nil {
		if errors.Is(err, errdefs.ErrNotFound) {
			return fmt.Sprintf("ramify: no sandbox %q on this server (the user name is the sandbox id; GET /v1/sandboxes/%s says more)\n",
				meta.User(), meta.User())
		}
	}
	return ""
}

// unavailable says why an authenticated connection's sandbox cannot take a session now ("" if it can).
func (s *Server) unavailable(id string) string {
	acc, err := s.svc.SSHAccess(id)
	switch {
	case err != nil:
		return err.Error()
	case acc.Status == sandbox.StatusPaused:
		return fmt.Sprintf("sandbox %s is paused: resume it (POST /v1/sandboxes/%s/resume, or `ramify resume %s`) and connect again", id, id, id)
	case acc.Status != sandbox.StatusRunning:
		return fmt.Sprintf("sandbox %s is %s, not running", id, acc.Status)
	}
	return ""
}
