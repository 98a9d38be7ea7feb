package sandbox

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"errors"
	"strings"
	"testing"

	"golang.org/x/crypto/ssh"

	"github.com/ramify-dev/ramify/internal/errdefs"
)

func pubkeyLine(t *testing.T, comment string) (string, ssh.PublicKey) {
	t.Helper()
	pub, _, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	pk, err := ssh.NewPublicKey(pub)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(ssh.MarshalAuthorizedKey(pk))) + " " + comment, pk
}

func TestSSHKeysValidatedStoredAndKeptAcrossRestart(t *testing.T) {
	ctx := context.Background()
	e := newEnv(t, func(c *Config) { c.SSHAddr, c.SSHHostKey = "localhost:2222", "ssh-ed25519 AAAAhost" })
	k1, pk1 := pubkeyLine(t, "one")
	k2, pk2 := pubkeyLine(t, "two")
	for _, bad := range []string{"ssh-ed25519 AAAA", "not a key", k1 + "\n" + k2, `command="x" ` + k1} {
		if _, err := e.svc.Create(ctx, CreateRequest{SSHPubkeys: []string{bad}}); !errors.Is(err, errdefs.ErrInvalid) {
			t.Fatalf("create with key %q: %v, want invalid", bad, err)
		}
	}
	if n := len(e.ids()); n != 0 {
		t.Fatalf("a refused create left %d sandboxes", n)
	}
	in, err := e.svc.Create(ctx, CreateRequest{SSHPubkeys: []string{"  " + k1 + "  "}})
	if err != nil {
		t.Fatal(err)
	}
	if in.SSH == nil || len(in.SSH.Keys) != 1 || in.SSH.Keys[0].Fingerprint != ssh.FingerprintSHA256(pk1) ||
		in.SSH.Command != "ssh -p 2222 "+in.ID+"@localhost" || in.SSH.KnownHosts != "[localhost]:2222 ssh-ed25519 AAAAhost" {
		t.Fatalf("ssh info: %+v", in.SSH)
	}
	if _, err := e.svc.AddSSHKeys(ctx, in.ID, []string{"nonsense"}); !errors.Is(err, errdefs.ErrInvalid) {
		t.Fatalf("add a bad key: %v", err)
	}
	got, err := e.svc.AddSSHKeys(ctx, in.ID, []string{k2, k1})
	if err != nil || len(got.SSH.Keys) != 2 {
		t.Fatalf("add: %+v, %v", got.SSH, err)
	}
	if _, err := e.svc.AddSSHKeys(ctx, "sbx_nosuch", []string{k2}); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("add to an unknown sandbox: %v", err)
	}
	e.svc.Close()
	e.start()
	acc, err := e.svc.SSHAccess(in.ID)
	if err != nil || acc.Status != StatusRunning || len(acc.Keys) != 2 ||
		string(acc.Keys[0].Marshal()) != string(pk1.Marshal()) || string(acc.Keys[1].Marshal()) != string(pk2.Marshal()) {
		t.Fatalf("after a restart: %+v, %v", acc, err)
	}
	if _, err := e.svc.SSHAccess("sbx_nosuch"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("access of an unknown sandbox: %v", err)
	}
}
