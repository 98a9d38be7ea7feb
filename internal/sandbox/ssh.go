package sandbox

import (
	"context"
	"fmt"
	"net"
	"strings"

	"golang.org/x/crypto/ssh"

	"github.com/ramify-dev/ramify/internal/agent"
)

// SSH access: a sandbox's spec holds the public keys allowed to open SSH sessions as it (ssh_pubkeys, given at
// create, at a fork, or added later); the SSH server (internal/sshd) checks keys here and starts its sessions
// through Session.

// MaxSSHKeys bounds how many keys one sandbox authorizes.
const MaxSSHKeys = 64

// SSHKey describes one authorized key, as GET shows it.
type SSHKey struct {
	Type        string `json:"type"`
	Fingerprint string `json:"fingerprint"` // SHA256:..., as ssh-keygen -l prints it
	Comment     string `json:"comment,omitempty"`
}

// SSHInfo is a sandbox's SSH access, as GET shows it.
type SSHInfo struct {
	Keys []SSHKey `json:"keys"`
	// Command connects to the sandbox with the system's ssh; absent when the server runs no SSH server.
	Command string `json:"command,omitempty"`
	// HostKey is the SSH server's public host key, and KnownHosts the line for ~/.ssh/known_hosts that makes ssh
	// trust it (absent when the server runs no SSH server).
	HostKey    string `json:"host_key,omitempty"`
	KnownHosts string `json:"known_hosts,omitempty"`
}

// normalizeSSHKeys checks the authorized_keys lines in add and returns have with them appended, in canonical
// form ("type base64 comment"), without duplicates (same key). A bad line is a 400 that names it.
func normalizeSSHKeys(have, add []string) ([]string, error) {
	out := append([]string(nil), have...)
	seen := map[string]bool{}
	for _, line := range have {
		if pk, _, _, _, err := ssh.ParseAuthorizedKey([]byte(line)); err == nil {
			seen[string(pk.Marshal())] = true
		}
	}
	for i, line := range add {
		line = strings.TrimSpace(line)
		if line == "" || strings.ContainsAny(line, "\r\n") {
			return nil, invalid("ssh_pubkeys[%d]: want one authorized_keys line (\"ssh-ed25519 AAAA... comment\")", i)
		}
		pk, comment, opts, rest, err := ssh.ParseAuthorizedKey([]byte(line))
		if err != nil {
			return nil, invalid("ssh_pubkeys[%d]: not an SSH public key: %v", i, err)
		}
		if len(opts) > 0 || len(rest) > 0 {
			return nil, invalid("ssh_pubkeys[%d]: one key without options, please", i)
		}
		if seen[string(pk.Marshal())] {
			continue
		}
		seen[string(pk.Marshal())] = true
		canon := strings.TrimSpace(string(ssh.MarshalAuthorizedKey(pk)))
		if comment = strings.TrimSpace(comment); comment != "" {
			canon += " " + comment
		}
		out = append(out, canon)
	}
	if len(out) > MaxSSHKeys {
		return nil, invalid("a sandbox authorizes at most %d SSH keys", MaxSSHKeys)
	}
	return out, nil
}

// sshInfo is what GET shows of a sandbox's SSH access (nil when it has no keys and the server no SSH server).
func (s *Service) sshInfo(id string, spec CreateRequest) *SSHInfo {
	if len(spec.SSHPubkeys) == 0 && s.cfg.SSHAddr == "" {
		return nil
	}
	in := &SSHInfo{Keys: []SSHKey{}}
	for _, line := range spec.SSHPubkeys {
		pk, comment, _, _, err := ssh.ParseAuthorizedKey([]byte(line))
		if err != nil {
			continue // validated when stored
		}
		in.Keys = append(in.Keys, SSHKey{Type: pk.Type(), Fingerprint: ssh.FingerprintSHA256(pk), Comment: comment})
	}
	if s.cfg.SSHAddr != "" {
		in.Command = SSHCommand(s.cfg.SSHAddr, id)
		in.HostKey = s.cfg.SSHHostKey
		in.KnownHosts = knownHostsLine(s.cfg.SSHAddr, s.cfg.SSHHostKey)
	}
	return in
}

// SSHCommand is the ssh command line that connects to sandbox id through the SSH server at addr (host:port).
func SSHCommand(addr, id string) string {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return "ssh " + id + "@" + addr
	}
	if port == "22" {
		return "ssh " + id + "@" + host
	}
	return "ssh -p " + port + " " + id + "@" + host
}

// knownHostsLine is the known_hosts line of the SSH server at addr with host key key.
func knownHostsLine(addr, key string) string {
	if key == "" {
		return ""
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil || port == "22" {
		return host + " " + key
	}
	return "[" + host + "]:" + port + " " + key
}

// AddSSHKeys authorizes more keys (authorized_keys lines) on a running or paused sandbox; keys it already has are
// skipped. The keys are stored with the sandbox at once.
func (s *Service) AddSSHKeys(ctx context.Context, id string, keys []string) (Info, error) {
	if len(keys) == 0 {
		return Info{}, invalid("keys: give at least one authorized_keys line")
	}
	if _, err := normalizeSSHKeys(nil, keys); err != nil {
		return Info{}, err
	}
	es, release, err := s.acquire(shared, OpSSHKeys, id)
	if err != nil {
		return Info{}, err
	}
	defer release()
	e := es[0]
	e.keep.Lock() // with SetTimeout: both rewrite the stored spec
	defer e.keep.Unlock()
	s.mu.Lock()
	spec, rec := e.spec, e.rec
	s.mu.Unlock()
	if spec.SSHPubkeys, err = normalizeSSHKeys(spec.SSHPubkeys, keys); err != nil {
		return Info{}, err
	}
	rec.Spec = specJSON(spec, e.timeoutFrom)
	if err := s.cfg.Store.Put(ctx, rec); err != nil {
		return Info{}, fmt.Errorf("store ssh keys of %s: %w", id, err)
	}
	s.mu.Lock()
	e.spec.SSHPubkeys, e.rec.Spec = spec.SSHPubkeys, rec.Spec
	info := s.info(e)
	s.mu.Unlock()
	s.log.Info("sandbox ssh keys added", "sandbox", id, "keys", len(spec.SSHPubkeys))
	return info, nil
}

// SSHAccess is what the SSH server needs to admit a connection as a sandbox.
type SSHAccess struct {
	Status Status
	Keys   []ssh.PublicKey
}

// SSHAccess returns sandbox id's status and authorized keys. An id that names no sandbox (or one deleted or
// merged away) is ErrNotFound with the API's message.
func (s *Service) SSHAccess(id string) (SSHAccess, error) {
	e, err := s.lookup(id)
	if err != nil {
		return SSHAccess{}, err
	}
	s.mu.Lock()
	st, lines := Status(e.rec.Status), e.spec.SSHPubkeys
	s.mu.Unlock()
	out := SSHAccess{Status: st}
	for _, line := range lines {
		if pk, _, _, _, err := ssh.ParseAuthorizedKey([]byte(line)); err == nil {
			out.Keys = append(out.Keys, pk)
		}
	}
	return out, nil
}

// Session starts an interactive session (a PTY or pipes, see agent.Session) in a running sandbox. It holds the
// sandbox only while it starts: a session left open does not hold back a pause or a destroy, which end it.
func (s *Service) Session(ctx context.Context, id string, r agent.SessionRequest) (*agent.Session, error) {
	if r.Cwd != "" && r.Cwd[0] != '/' {
		return nil, invalid("cwd must be an absolute path")
	}
	for k, v := range r.Env {
		if err := validEnv(k, v); err != nil {
			return nil, err
		}
	}
	_, e, done, err := s.use(ctx, id) // the session outlives the hold: it keeps ctx
	if err != nil {
		return nil, err
	}
	defer done()
	c, err := s.cfg.Runtime.Agent(e.rec.ID)
	if err != nil {
		return nil, err
	}
	sess, err := c.Session(ctx, r)
	if err != nil {
		return nil, fmt.Errorf("session in %s: %w", id, err)
	}
	return sess, nil
}
