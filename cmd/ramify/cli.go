package main

// The client verbs of the CLI: every verb but serve and image talks to a server through package client.
// Each verb is a method of cli, which holds the client and the standard streams so that tests can run verbs
// against a stub server and read their output.

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"net"
	"os"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/ramify-dev/ramify/client"
)

// cli is what a client verb runs with.
type cli struct {
	c      *client.Client
	stdout io.Writer
	stderr io.Writer
	stdin  io.Reader
	now    func() time.Time
}

// exitStatus is returned by a verb that wants the process to exit with this code without printing an error
// (run after a Python exception, exec with the command's exit code).
type exitStatus int

func (e exitStatus) Error() string { return fmt.Sprintf("exit status %d", int(e)) }

// verb is the signature of a client verb.
type verb func(e *cli, ctx context.Context, args []string) error

// registerClient registers a verb that needs a client built from the environment.
func registerClient(name, summary string, fn verb) {
	register(name, summary, clientRunner(fn))
}

// registerClientHidden registers an alias that is not listed in the usage.
func registerClientHidden(name string, fn verb) {
	registerHidden(name, clientRunner(fn))
}

func clientRunner(fn verb) func(ctx context.Context, args []string) error {
	return func(ctx context.Context, args []string) error {
		e := &cli{stdout: os.Stdout, stderr: os.Stderr, stdin: os.Stdin, now: time.Now}
		err := e.runVerb(ctx, fn, args)
		var es exitStatus
		switch {
		case err == nil:
			return nil
		case errors.As(err, &es):
			os.Exit(int(es))
		case errors.Is(err, flag.ErrHelp):
			os.Exit(0)
		}
		return err
	}
}

// runVerb builds the client from the environment and runs the verb. The error it returns is the one to show:
// explained, and under --json already written to stdout as {"error": ..., "hint": ...} (then an exitStatus).
func (e *cli) runVerb(ctx context.Context, fn verb, args []string) error {
	c, err := client.FromEnv()
	if err == nil {
		e.c = c
		err = fn(e, ctx, args)
	}
	var es exitStatus
	if err == nil || errors.As(err, &es) || errors.Is(err, flag.ErrHelp) {
		return err
	}
	if e.c != nil {
		err = e.explain(err)
	}
	if !wantsJSON(args) {
		return err
	}
	out := struct {
		Error string `json:"error"`
		Hint  string `json:"hint,omitempty"`
	}{Error: err.Error()}
	var he *hintedError
	if errors.As(err, &he) {
		out.Error, out.Hint = he.msg, he.hint
	}
	e.printJSON(out) //nolint:errcheck // the exit status tells the failure either way
	return exitStatus(1)
}

// wantsJSON reports whether a verb's arguments ask for --json (before any "--").
func wantsJSON(args []string) bool {
	for _, a := range args {
		switch a {
		case "--":
			return false
		case "--json", "-json", "--json=true", "-json=true":
			return true
		}
	}
	return false
}

// Hints printed under errors.
const (
	hintUnauthorized = "check RAMIFY_API_KEY; the server printed it at start and saved it in <data-dir>/api-key"
	hintNoKey        = "RAMIFY_API_KEY is not set; the server printed the key at start and saved it in <data-dir>/api-key"
	hintUnreachable  = "is the server running? start it with 'make run' or 'ramify serve' (or set RAMIFY_API_URL)"
	hintNotFound     = "'ramify ls' lists the sandboxes"
	hintConflict     = "'ramify ls' shows each sandbox's status; a paused sandbox needs 'ramify resume <id>'"
)

// explain turns an error into the text printed to the user: the server's message and a hint.
func (e *cli) explain(err error) error {
	var ae *client.APIError
	var ne net.Error
	switch {
	case errors.As(err, &ae):
		msg := ae.Message
		if ae.StatusCode >= 500 {
			msg = fmt.Sprintf("server error (HTTP %d): %s", ae.StatusCode, msg)
		}
		switch {
		case errors.Is(err, client.ErrUnauthorized) && !e.c.HasAPIKey():
			return hinted(msg, hintNoKey)
		case errors.Is(err, client.ErrUnauthorized):
			return hinted(msg, hintUnauthorized)
		case errors.Is(err, client.ErrNotFound) && strings.Contains(msg, "sandbox"):
			return hinted(msg, hintNotFound)
		case errors.Is(err, client.ErrConflict):
			return hinted(msg, hintConflict)
		}
		return errors.New(msg)
	case isLocalFileError(err):
		var pe *fs.PathError
		errors.As(err, &pe)
		return fmt.Errorf("local file %s: %w", pe.Path, pe.Err)
	case errors.Is(err, syscall.ECONNREFUSED):
		return hinted(fmt.Sprintf("cannot reach the server at %s: connection refused", e.c.BaseURL()), hintUnreachable)
	case errors.Is(err, context.Canceled):
		return errors.New("interrupted")
	case errors.As(err, &ne):
		return hinted(fmt.Sprintf("cannot reach the server at %s: %v", e.c.BaseURL(), err), hintUnreachable)
	}
	return err
}

// hintedError is a message with a hint on what to do.
type hintedError struct{ msg, hint string }

func (h *hintedError) Error() string { return h.msg + "\n  hint: " + h.hint }

func hinted(msg, hint string) error { return &hintedError{msg, hint} }

// isLocalFileError reports an error about a file on this machine (cp's source, run -f): not the network's,
// although the errno inside it looks like a net.Error.
func isLocalFileError(err error) bool {
	var pe *fs.PathError
	var oe *net.OpError
	return errors.As(err, &pe) && !errors.As(err, &oe)
}

// flags returns a FlagSet for a verb with the common --json flag; usage is the synopsis after "ramify".
func (e *cli) flags(usage string) (*flag.FlagSet, *bool) {
	fs := flag.NewFlagSet(usage, flag.ContinueOnError)
	fs.SetOutput(e.stderr)
	fs.Usage = func() {
		fmt.Fprintf(e.stderr, "Usage: ramify %s\n", usage)
		fs.PrintDefaults()
	}
	asJSON := fs.Bool("json", false, "print machine-readable JSON")
	return fs, asJSON
}

// parseArgs parses flags anywhere among the arguments ("ramify fork sbx_1 -n 3"). It returns the positional
// arguments and, separately, everything after a "--" terminator (dashdash reports whether there was one).
func parseArgs(fs *flag.FlagSet, args []string) (pos, rest []string, dashdash bool, err error) {
	pos = []string{}
	for {
		if err := fs.Parse(args); err != nil {
			return nil, nil, false, err
		}
		rem := fs.Args()
		if used := len(args) - len(rem); used > 0 && args[used-1] == "--" {
			return pos, rem, true, nil
		}
		if len(rem) == 0 {
			return pos, nil, false, nil
		}
		pos = append(pos, rem[0])
		args = rem[1:]
	}
}

// usageError reports wrong positional arguments with the verb's usage line.
func usageError(fs *flag.FlagSet, format string, a ...any) error {
	return fmt.Errorf("%s\nusage: ramify %s", fmt.Sprintf(format, a...), fs.Name())
}

// printJSON writes v as indented JSON.
func (e *cli) printJSON(v any) error {
	enc := json.NewEncoder(e.stdout)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// kvFlag is a repeatable K=V flag.
type kvFlag map[string]string

func (f kvFlag) String() string {
	keys := make([]string, 0, len(f))
	for k := range f {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	parts := make([]string, len(keys))
	for i, k := range keys {
		parts[i] = k + "=" + f[k]
	}
	return strings.Join(parts, ",")
}

func (f kvFlag) Set(s string) error {
	k, v, ok := strings.Cut(s, "=")
	if !ok || k == "" {
		return fmt.Errorf("want KEY=VALUE, got %q", s)
	}
	f[k] = v
	return nil
}

// listFlag is a repeatable string flag.
type listFlag []string

func (f *listFlag) String() string     { return strings.Join(*f, ",") }
func (f *listFlag) Set(s string) error { *f = append(*f, s); return nil }

// secondsFlag takes whole seconds ("300") or a Go duration ("5m"). set reports whether it was given.
type secondsFlag struct {
	n   int
	set bool
}

func (f *secondsFlag) String() string {
	if f == nil || !f.set {
		return ""
	}
	return strconv.Itoa(f.n)
}

func (f *secondsFlag) Set(s string) error {
	if n, err := strconv.Atoi(s); err == nil {
		if n < 0 {
			return errors.New("must not be negative")
		}
		f.n, f.set = n, true
		return nil
	}
	d, err := time.ParseDuration(s)
	if err != nil || d < 0 {
		return fmt.Errorf("want seconds or a duration like 90s or 5m, got %q", s)
	}
	f.n, f.set = int((d+time.Second-1)/time.Second), true
	return nil
}

// ptr returns the value as an optional API field (nil when the flag was not given).
func (f *secondsFlag) ptr() *int {
	if !f.set {
		return nil
	}
	return client.Int(f.n)
}

// memFlag takes MiB ("2048") or a size with a unit ("512M", "2G", "2GiB").
type memFlag int

func (f *memFlag) String() string { return strconv.Itoa(int(*f)) }

func (f *memFlag) Set(s string) error {
	u := strings.ToUpper(strings.TrimSpace(s))
	mult := 1
	for _, suf := range []struct {
		s string
		m int
	}{{"GIB", 1024}, {"GB", 1024}, {"G", 1024}, {"MIB", 1}, {"MB", 1}, {"M", 1}} {
		if strings.HasSuffix(u, suf.s) {
			u, mult = strings.TrimSuffix(u, suf.s), suf.m
			break
		}
	}
	n, err := strconv.Atoi(strings.TrimSpace(u))
	if err != nil || n <= 0 {
		return fmt.Errorf("want MiB or a size like 512M or 2G, got %q", s)
	}
	*f = memFlag(n * mult)
	return nil
}

// humanAge prints a duration the way ls tables do: 45s, 12m, 3h, 5d.
func humanAge(d time.Duration) string {
	switch {
	case d < 0:
		return "0s"
	case d < time.Minute:
		return fmt.Sprintf("%ds", int(d/time.Second))
	case d < time.Hour:
		return fmt.Sprintf("%dm", int(d/time.Minute))
	case d < 48*time.Hour:
		return fmt.Sprintf("%dh", int(d/time.Hour))
	}
	return fmt.Sprintf("%dd", int(d/(24*time.Hour)))
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

func init() {
	registerClient("health", "check that the server answers (GET /healthz)", (*cli).health)
}

func (e *cli) health(ctx context.Context, args []string) error {
	fs, asJSON := e.flags("health [--json]")
	pos, _, _, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 0 {
		return usageError(fs, "health takes no arguments")
	}
	h, err := e.c.Health(ctx)
	if err != nil {
		return err
	}
	if *asJSON {
		return e.printJSON(h)
	}
	fmt.Fprintf(e.stdout, "%s: %s (version %s)\n", e.c.BaseURL(), h.Status, orDash(h.Version))
	return nil
}
