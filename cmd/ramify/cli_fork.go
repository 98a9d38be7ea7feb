package main

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/ramify-dev/ramify/client"
)

func init() {
	registerClient("fork", "fork a sandbox into n children (prints their ids)", (*cli).fork)
	registerClient("merge", "merge a fork child's state into its parent: merge <parent> <winner>", (*cli).merge)
	registerClient("diff", "compare the files of two sandboxes: + only in b, - only in a, M changed", (*cli).diff)
	registerClient("pause", "pause a sandbox (waits until paused unless --no-wait)", (*cli).pause)
	registerClient("resume", "resume a paused sandbox (waits until running unless --no-wait)", (*cli).resume)
}

func (e *cli) fork(ctx context.Context, args []string) error {
	fs, asJSON := e.flags("fork <id> [-n N] [--json]")
	n := fs.Int("n", 1, "number of children, 1 .. 32")
	pos, _, _, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return usageError(fs, "fork takes one sandbox id")
	}
	kids, err := e.c.Fork(ctx, pos[0], *n)
	if err != nil {
		return err
	}
	if *asJSON {
		return e.printJSON(map[string]any{"children": kids})
	}
	for _, k := range kids {
		fmt.Fprintln(e.stdout, k)
	}
	return nil
}

func (e *cli) merge(ctx context.Context, args []string) error {
	fs, asJSON := e.flags("merge <parent> <winner> [--json]")
	pos, _, _, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 2 {
		return usageError(fs, "merge takes the parent's id and the winner's id")
	}
	parent, winner := pos[0], pos[1]
	if err := e.c.MergeInto(ctx, parent, winner); err != nil {
		return err
	}
	if *asJSON {
		return e.printJSON(map[string]any{"parent": parent, "winner": winner, "merged": true})
	}
	fmt.Fprintf(e.stdout, "merged %s into %s: %s now has %s's state; %s is retired (other children are untouched)\n",
		winner, parent, parent, winner, winner)
	return nil
}

func (e *cli) diff(ctx context.Context, args []string) error {
	fs, asJSON := e.flags("diff <a> <b> [--path P]... [--json]")
	var paths listFlag
	fs.Var(&paths, "path", "absolute directory to compare (repeatable; default /root and /tmp)")
	pos, _, _, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 2 {
		return usageError(fs, "diff takes two sandbox ids")
	}
	d, err := e.c.Diff(ctx, pos[0], pos[1], paths)
	if err != nil {
		return err
	}
	if *asJSON {
		return e.printJSON(d)
	}
	fmt.Fprint(e.stdout, formatDiff(d))
	return nil
}

// showProgress prints, every interval until the returned function is called, how far sandbox id's pause or
// resume has got (GET's progress), when it moved since the last line: a pause of gigabytes to S3 takes a while.
func (e *cli) showProgress(ctx context.Context, id string, interval time.Duration) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		t := time.NewTicker(interval)
		defer t.Stop()
		last := ""
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			sb, err := e.c.Get(ctx, id)
			if err != nil || sb.Progress == nil {
				continue
			}
			if line := progressLine(sb.Progress); line != last {
				fmt.Fprintf(e.stderr, "  %s\n", line)
				last = line
			}
		}
	}()
	return func() {
		cancel()
		<-done
	}
}

// progressLine renders a pause's or resume's progress: "session: 412.0 MiB" or "files: 12.0 MiB of 1.0 GiB (1%)".
func progressLine(p *client.Progress) string {
	if p.TotalBytes > 0 {
		return fmt.Sprintf("%s: %s of %s (%d%%)", p.Phase, humanBytes(p.Bytes), humanBytes(p.TotalBytes), p.Bytes*100/p.TotalBytes)
	}
	return fmt.Sprintf("%s: %s", p.Phase, humanBytes(p.Bytes))
}

// formatDiff prints a diff one path a line: "+ p" only in b, "- p" only in a, "M p" in both but different.
func formatDiff(d *client.Diff) string {
	var b strings.Builder
	for _, p := range d.Added {
		b.WriteString("+ " + shownName(p) + "\n")
	}
	for _, p := range d.Removed {
		b.WriteString("- " + shownName(p) + "\n")
	}
	for _, p := range d.Modified {
		b.WriteString("M " + shownName(p) + "\n")
	}
	return b.String()
}

func (e *cli) pause(ctx context.Context, args []string) error {
	return e.lifecycle(ctx, args, "pause", "pausing", client.StatusPaused, e.c.Pause)
}

func (e *cli) resume(ctx context.Context, args []string) error {
	return e.lifecycle(ctx, args, "resume", "resuming", client.StatusRunning, e.c.Resume)
}

// lifecycle runs pause or resume and, unless --no-wait, waits for the target status.
func (e *cli) lifecycle(ctx context.Context, args []string, verb, doing, want string,
	call func(context.Context, string) (*client.Sandbox, time.Duration, error)) error {
	fs, asJSON := e.flags(verb + " <id> [--no-wait] [--wait-timeout D] [--json]")
	noWait := fs.Bool("no-wait", false, "return once the server accepted the request, without waiting")
	waitTimeout := fs.Duration("wait-timeout", 5*time.Minute, "give up waiting after this long")
	pos, _, _, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return usageError(fs, "%s takes one sandbox id", verb)
	}
	id := pos[0]
	start := time.Now()
	sb, _, err := call(ctx, id)
	if err != nil {
		return err
	}
	if !*noWait && sb.Status != want {
		if !*asJSON {
			fmt.Fprintf(e.stderr, "%s %s ...\n", doing, id)
		}
		wctx, cancel := context.WithTimeout(ctx, *waitTimeout)
		defer cancel()
		stop := func() {}
		if !*asJSON {
			stop = e.showProgress(wctx, id, time.Second)
		}
		// No sleeping out the 202's X-Poll-After first: the server's wait answers at the transition.
		sb, err = e.c.WaitStatus(wctx, id, want)
		stop()
		if err != nil {
			if errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil {
				return fmt.Errorf("%s %s: still not %s after %v; check with 'ramify get %s'", verb, id, want, *waitTimeout, id)
			}
			return err
		}
	}
	if *asJSON {
		return e.printJSON(sb)
	}
	if sb.Status == want {
		fmt.Fprintf(e.stdout, "%s %s (%.1fs)\n", id, sb.Status, time.Since(start).Seconds())
	} else {
		fmt.Fprintf(e.stdout, "%s %s\n", id, sb.Status)
	}
	return nil
}
