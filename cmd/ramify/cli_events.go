package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/ramify-dev/ramify/client"
)

func init() {
	registerClient("events", "follow lifecycle events (created, forked, merged, paused, destroyed...) as they happen", (*cli).events)
	registerClient("logs", "print a sandbox's recent agent and family log lines", (*cli).logs)
}

func (e *cli) events(ctx context.Context, args []string) error {
	fs, asJSON := e.flags("events [--sandbox ID] [--family ID] [--after EVENT_ID] [--count N] [--json]")
	sb := fs.String("sandbox", "", "only events concerning this sandbox (as subject, fork parent or child, merge winner)")
	fam := fs.String("family", "", "only events of this fork family")
	after := fs.Uint64("after", 0, "start after this event id (from the server's recent history); default: from now on")
	count := fs.Int("count", 0, "exit after this many events (0: follow until interrupted)")
	pos, _, _, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 0 {
		return usageError(fs, "events takes no positional arguments")
	}
	n := 0
	errDone := errors.New("done")
	err = e.c.Events(ctx, client.EventsOptions{Sandbox: *sb, Family: *fam, After: *after, Reconnect: true},
		func(ev client.LifecycleEvent) error {
			if *asJSON {
				b, _ := json.Marshal(ev)
				fmt.Fprintln(e.stdout, string(b))
			} else {
				fmt.Fprintln(e.stdout, formatEvent(ev))
			}
			n++
			if *count > 0 && n >= *count {
				return errDone
			}
			return nil
		})
	if errors.Is(err, errDone) || errors.Is(err, context.Canceled) {
		return nil
	}
	return err
}

// formatEvent is one line: time, id, type, subject and what else the event says.
func formatEvent(ev client.LifecycleEvent) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %-16d %-12s %s", ev.Time.Local().Format("15:04:05.000"), ev.ID, ev.Type, orDash(ev.Sandbox))
	add := func(k, v string) {
		if v != "" {
			fmt.Fprintf(&b, " %s=%s", k, v)
		}
	}
	add("children", strings.Join(ev.Children, ","))
	add("winner", ev.Winner)
	add("other", ev.Other)
	add("parent", ev.Parent)
	add("status", ev.Status)
	if ev.Ms > 0 {
		add("ms", fmt.Sprintf("%.1f", ev.Ms))
	}
	if ev.PauseMs > 0 {
		add("pause_ms", fmt.Sprintf("%.2f", ev.PauseMs))
	}
	if ev.Bytes > 0 {
		add("bytes", fmt.Sprint(ev.Bytes))
	}
	add("reason", ev.Reason)
	add("error", ev.Error)
	if ev.Type == "missed" {
		add("after", fmt.Sprint(ev.After))
		add("oldest", fmt.Sprint(ev.Oldest))
	}
	return b.String()
}

func (e *cli) logs(ctx context.Context, args []string) error {
	fs, asJSON := e.flags("logs <id> [--json]")
	pos, _, _, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return usageError(fs, "logs takes one sandbox id")
	}
	lines, err := e.c.Logs(ctx, pos[0])
	if err != nil {
		return err
	}
	if *asJSON {
		return e.printJSON(lines)
	}
	for _, l := range lines {
		fmt.Fprintf(e.stdout, "%s %-6s %s\n", l.Time.Local().Format("2006-01-02 15:04:05.000"), l.Source, l.Text)
	}
	return nil
}
