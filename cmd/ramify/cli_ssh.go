package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"

	"github.com/ramify-dev/ramify/client"
)

func init() {
	registerClient("ssh", "open a shell (or run a command) in a sandbox over SSH: ssh <id> [-i KEY] [-o OPT]... [-- command...]", (*cli).ssh)
	registerClient("ssh-key add", "authorize SSH public keys on a sandbox: ssh-key add <id> <key.pub or key line>...", (*cli).sshKeyAdd)
}

// stringsFlag is a repeatable string flag.
type stringsFlag []string

func (f *stringsFlag) String() string     { return strings.Join(*f, ",") }
func (f *stringsFlag) Set(v string) error { *f = append(*f, v); return nil }

// readPubkeys reads authorized_keys lines: each argument is a public key file or a key line itself.
func readPubkeys(args []string) ([]string, error) {
	var keys []string
	for _, a := range args {
		if strings.HasPrefix(a, "ssh-") || strings.HasPrefix(a, "ecdsa-") || strings.HasPrefix(a, "sk-") {
			keys = append(keys, a)
			continue
		}
		b, err := os.ReadFile(a)
		if err != nil {
			return nil, err
		}
		for _, line := range strings.Split(string(b), "\n") {
			if line = strings.TrimSpace(line); line != "" && !strings.HasPrefix(line, "#") {
				keys = append(keys, line)
			}
		}
	}
	return keys, nil
}

func (e *cli) sshKeyAdd(ctx context.Context, args []string) error {
	fs, asJSON := e.flags("ssh-key add <id> <key.pub or key line>... [--json]")
	pos, _, _, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	if len(pos) < 2 {
		return usageError(fs, "ssh-key add takes a sandbox id and at least one key")
	}
	keys, err := readPubkeys(pos[1:])
	if err != nil {
		return err
	}
	sb, err := e.c.AddSSHKeys(ctx, pos[0], keys)
	if err != nil {
		return err
	}
	if *asJSON {
		return e.printJSON(sb.SSH)
	}
	printSSH(e, sb)
	return nil
}

// printSSH prints a sandbox's authorized keys and how to connect.
func printSSH(e *cli, sb *client.Sandbox) {
	if sb.SSH == nil {
		return
	}
	for _, k := range sb.SSH.Keys {
		fmt.Fprintf(e.stdout, "%s %s %s\n", k.Type, k.Fingerprint, k.Comment)
	}
	if sb.SSH.Command != "" {
		fmt.Fprintf(e.stdout, "connect: ramify ssh %s   (or %s)\n", sb.ID, sb.SSH.Command)
	}
}

// ssh runs the system's ssh client against the server's SSH server, trusting the host key the API reports
// (kept in a known_hosts file of ramify's own, so ~/.ssh/known_hosts is not touched).
func (e *cli) ssh(ctx context.Context, args []string) error {
	fs, _ := e.flags("ssh <id> [-i KEY] [-o OPTION]... [-- command...]")
	identity := fs.String("i", "", "private key file for ssh (default: ssh's own choice, e.g. ~/.ssh/id_ed25519 or the agent)")
	var opts stringsFlag
	fs.Var(&opts, "o", "ssh option, as ssh -o takes it (repeatable)")
	pos, rest, _, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	if len(pos) < 1 {
		return usageError(fs, "ssh takes a sandbox id")
	}
	id, command := pos[0], append(pos[1:], rest...)
	sb, err := e.c.Get(ctx, id)
	if err != nil {
		return err
	}
	if sb.SSH == nil || sb.SSH.Command == "" {
		return hinted("the server runs no SSH server", "start it with 'ramify serve --ssh-listen :2222' (see docs/ssh.md)")
	}
	if len(sb.SSH.Keys) == 0 {
		return hinted(fmt.Sprintf("sandbox %s authorizes no SSH key", id),
			fmt.Sprintf("add yours: ramify ssh-key add %s ~/.ssh/id_ed25519.pub", id))
	}
	known, err := knownHostsFile(sb.SSH.KnownHosts)
	if err != nil {
		return err
	}
	argv := sshArgv(sb.SSH.Command, known, *identity, opts, command)
	path, err := exec.LookPath("ssh")
	if err != nil {
		return hinted("no ssh client found", "install OpenSSH's client (apt install openssh-client), or run: "+strings.Join(argv, " "))
	}
	return syscall.Exec(path, argv, os.Environ())
}

// sshArgv builds the ssh command line from the API's command ("ssh -p PORT id@host").
func sshArgv(apiCommand, knownHosts, identity string, opts, command []string) []string {
	f := strings.Fields(apiCommand)
	argv := []string{"ssh", "-o", "UserKnownHostsFile=" + knownHosts, "-o", "StrictHostKeyChecking=yes"}
	if identity != "" {
		argv = append(argv, "-i", identity)
	}
	for _, o := range opts {
		argv = append(argv, "-o", o)
	}
	argv = append(argv, f[1:]...)
	if len(command) > 0 {
		argv = append(argv, "--")
		argv = append(argv, command...)
	}
	return argv
}

// knownHostsFile writes the server's known_hosts line into ramify's known_hosts file (in the user's cache
// directory), replacing an older line for the same host, and returns its path.
func knownHostsFile(line string) (string, error) {
	if line == "" {
		return "", errors.New("the server did not report its SSH host key")
	}
	dir, err := os.UserCacheDir()
	if err != nil {
		dir = os.TempDir()
	}
	dir = filepath.Join(dir, "ramify")
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return "", err
	}
	path := filepath.Join(dir, "known_hosts")
	host := strings.Fields(line)[0]
	var keep []string
	if b, err := os.ReadFile(path); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if f := strings.Fields(l); len(f) > 0 && f[0] != host {
				keep = append(keep, l)
			}
		}
	}
	keep = append(keep, line)
	tmp := path + fmt.Sprintf(".%d", os.Getpid())
	if err := os.WriteFile(tmp, []byte(strings.Join(keep, "\n")+"\n"), 0o600); err != nil {
		return "", err
	}
	return path, os.Rename(tmp, path)
}
