package main

import (
	"context"
	"fmt"
	"io"
	"os"
	"strings"

	"github.com/ramify-dev/ramify/client"
)

func init() {
	registerClient("run", "run Python code in a sandbox's persistent interpreter", (*cli).run)
	registerClient("exec", "run a command in a sandbox", (*cli).exec)
	registerClient("interrupt", "stop the run and exec calls running in a sandbox (KeyboardInterrupt; commands killed)", (*cli).interrupt)
}

// lastByteWriter remembers the last byte written through it.
type lastByteWriter struct {
	w    io.Writer
	last byte
	n    int64
}

func (l *lastByteWriter) Write(p []byte) (int, error) {
	if len(p) > 0 {
		l.last = p[len(p)-1]
		l.n += int64(len(p))
	}
	return l.w.Write(p)
}

// endLine writes a newline if something was written that did not end with one.
func (l *lastByteWriter) endLine() {
	if l.n > 0 && l.last != '\n' {
		l.Write([]byte{'\n'})
	}
}

func (e *cli) run(ctx context.Context, args []string) error {
	fs, asJSON := e.flags("run <id> 'code' | <id> - | <id> -f file [--env K=V] [--timeout S] [--json]")
	file := fs.String("f", "", "read the code from this file ('-' = stdin)")
	env := kvFlag{}
	fs.Var(env, "env", "environment variable K=V for this run only (repeatable)")
	var timeout secondsFlag
	fs.Var(&timeout, "timeout", "interrupt the code after this many seconds or this duration (server default 300; 0 = no limit)")
	pos, rest, _, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	pos = append(pos, rest...)
	var code string
	switch {
	case len(pos) == 0:
		return usageError(fs, "run needs a sandbox id")
	case *file != "" && len(pos) == 1:
		code, err = e.readSource(*file)
	case *file == "" && len(pos) == 2 && pos[1] == "-":
		code, err = e.readSource("-")
	case *file == "" && len(pos) == 2:
		code = pos[1]
	default:
		return usageError(fs, "run takes a sandbox id and the code (one argument; '-' or -f for stdin or a file)")
	}
	if err != nil {
		return err
	}
	id := pos[0]
	req := client.RunCodeRequest{Code: code, TimeoutS: timeout.ptr()}
	if len(env) > 0 {
		req.Env = env
	}
	if *asJSON {
		ex, err := e.c.RunCode(ctx, id, req)
		if err != nil {
			return err
		}
		if err := e.printJSON(ex); err != nil {
			return err
		}
		if ex.Error != nil {
			return exitStatus(1)
		}
		return nil
	}
	out := &lastByteWriter{w: e.stdout}
	errw := &lastByteWriter{w: e.stderr}
	ex, err := e.c.RunCodeStream(ctx, id, req, func(ev client.Event) {
		switch ev.Type {
		case "stdout":
			io.WriteString(out, ev.Data)
		case "stderr":
			io.WriteString(errw, ev.Data)
		case "display_data": // as terminal IPython shows a display: its text/plain (--json has every format)
			if ev.Result != nil {
				out.endLine()
				fmt.Fprintln(out, ev.Result.Text())
			}
		}
	})
	if err != nil {
		out.endLine()
		return err
	}
	if ex.Value != nil {
		out.endLine()
		fmt.Fprintln(out, *ex.Value)
	}
	if ex.Error != nil {
		out.endLine()
		errw.endLine()
		tb := ex.Error.Traceback
		if strings.TrimSpace(tb) == "" {
			tb = ex.Error.Error()
		}
		io.WriteString(errw, tb)
		errw.endLine()
		return exitStatus(1)
	}
	return nil
}

// readSource reads code from a file or, for "-", from stdin.
func (e *cli) readSource(name string) (string, error) {
	var b []byte
	var err error
	if name == "-" {
		b, err = io.ReadAll(e.stdin)
	} else {
		b, err = os.ReadFile(name)
	}
	if err != nil {
		return "", fmt.Errorf("read code: %w", err)
	}
	return string(b), nil
}

func (e *cli) exec(ctx context.Context, args []string) error {
	fs, asJSON := e.flags("exec <id> [flags] -- cmd args... | exec <id> [flags] 'shell command'")
	env := kvFlag{}
	fs.Var(env, "env", "environment variable K=V (repeatable)")
	cwd := fs.String("cwd", "", "working directory (default the sandbox's)")
	var timeout secondsFlag
	fs.Var(&timeout, "timeout", "kill the command after this many seconds or this duration (server default 300; 0 = no limit)")
	stdin := fs.Bool("i", false, "send this process's stdin to the command (read whole before the command starts)")
	pos, rest, dashdash, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	if len(pos) == 0 {
		return usageError(fs, "exec needs a sandbox id")
	}
	id := pos[0]
	req := client.ExecRequest{Cwd: *cwd, TimeoutS: timeout.ptr()}
	switch {
	case dashdash && len(pos) == 1 && len(rest) > 0:
		req.Argv = rest
	case !dashdash && len(pos) == 2:
		req.Cmd = pos[1]
	case !dashdash && len(pos) > 2:
		req.Argv = pos[1:]
	default:
		return usageError(fs, "exec takes a sandbox id and a command: after '--' as separate arguments, or one shell string")
	}
	if len(env) > 0 {
		req.Env = env
	}
	if *stdin {
		b, err := io.ReadAll(e.stdin)
		if err != nil {
			return fmt.Errorf("read stdin: %w", err)
		}
		req.Stdin = string(b)
	}
	var res *client.ExecResult
	if *asJSON {
		res, err = e.c.Exec(ctx, id, req)
		if err == nil {
			err = e.printJSON(res)
		}
	} else {
		res, err = e.c.ExecStream(ctx, id, req, func(ev client.Event) {
			switch ev.Type {
			case "stdout":
				io.WriteString(e.stdout, ev.Data)
			case "stderr":
				io.WriteString(e.stderr, ev.Data)
			}
		})
	}
	if err != nil {
		return err
	}
	code := res.ExitCode
	if res.TimedOut {
		if !*asJSON {
			fmt.Fprintln(e.stderr, "ramify: the command timed out and was killed")
		}
		if code == 0 {
			code = 124
		}
	}
	if code != 0 {
		return exitStatus(code)
	}
	return nil
}

func (e *cli) interrupt(ctx context.Context, args []string) error {
	fs, asJSON := e.flags("interrupt <id> [--only run_code|exec] [--json]")
	only := fs.String("only", "", "stop only run_code calls or only exec calls")
	pos, rest, _, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	pos = append(pos, rest...)
	if len(pos) != 1 {
		return usageError(fs, "interrupt takes one sandbox id")
	}
	if *only != "" && *only != client.InterruptRunCode && *only != client.InterruptExec {
		return usageError(fs, "interrupt: --only is run_code or exec, not %q", *only)
	}
	n, err := e.c.Interrupt(ctx, pos[0], *only)
	if err != nil {
		return err
	}
	if *asJSON {
		return e.printJSON(map[string]any{"interrupted": n})
	}
	if n == (client.Interrupted{}) {
		fmt.Fprintf(e.stdout, "%s: nothing was running\n", pos[0])
		return nil
	}
	fmt.Fprintf(e.stdout, "%s: stopped %d run_code and %d exec call(s); each returned to its caller as interrupted\n",
		pos[0], n.RunCode, n.Exec)
	return nil
}
