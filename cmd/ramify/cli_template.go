package main

import (
	"context"
	"fmt"
	"text/tabwriter"

	"github.com/ramify-dev/ramify/client"
)

func init() {
	registerClient("template save", "capture a running sandbox (files and variables) as a named template", (*cli).templateSave)
	registerClient("template ls", "list templates (NAME SIZE FROM AGE)", (*cli).templateLs)
	registerClient("template get", "show one template", (*cli).templateGet)
	registerClient("template rm", "delete templates", (*cli).templateRm)
}

func (e *cli) templateSave(ctx context.Context, args []string) error {
	fs, asJSON := e.flags("template save <name> <sandbox-id> [--json]")
	pos, _, _, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 2 {
		return usageError(fs, "template save takes a name and a sandbox id (got %q)", pos)
	}
	t, err := e.c.SaveTemplate(ctx, pos[0], pos[1])
	if err != nil {
		return err
	}
	if *asJSON {
		return e.printJSON(t)
	}
	fmt.Fprintln(e.stdout, t.Name)
	fmt.Fprintf(e.stderr, "saved template %s from %s (%s, %.0f ms)\n", t.Name, t.From, humanBytes(t.Size), t.CaptureMs)
	for _, s := range t.NotSaved {
		fmt.Fprintf(e.stderr, "  not saved: %s (%s)\n", s.Name, s.Reason)
	}
	fmt.Fprintf(e.stderr, "  start a sandbox from it: ramify sandbox create --template %s\n", t.Name)
	return nil
}

func (e *cli) templateLs(ctx context.Context, args []string) error {
	fs, asJSON := e.flags("template ls [--json]")
	pos, _, _, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 0 {
		return usageError(fs, "template ls takes no positional arguments (got %q)", pos)
	}
	ts, err := e.c.Templates(ctx)
	if err != nil {
		return err
	}
	if *asJSON {
		if ts == nil {
			ts = []client.Template{}
		}
		return e.printJSON(map[string]any{"templates": ts})
	}
	tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tSIZE\tFROM\tAGE")
	for _, t := range ts {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\n", t.Name, humanBytes(t.Size), t.From, humanAge(e.now().Sub(t.CreatedAt)))
	}
	return tw.Flush()
}

func (e *cli) templateGet(ctx context.Context, args []string) error {
	fs, _ := e.flags("template get <name> [--json]")
	pos, _, _, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return usageError(fs, "template get takes one name (got %q)", pos)
	}
	t, err := e.c.GetTemplate(ctx, pos[0])
	if err != nil {
		return err
	}
	return e.printJSON(t)
}

func (e *cli) templateRm(ctx context.Context, args []string) error {
	fs, asJSON := e.flags("template rm <name>... [--json]")
	pos, _, _, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	if len(pos) == 0 {
		return usageError(fs, "template rm takes one or more names")
	}
	for _, name := range pos {
		if err := e.c.DeleteTemplate(ctx, name); err != nil {
			return fmt.Errorf("template %s: %w", name, err)
		}
		if !*asJSON {
			fmt.Fprintln(e.stdout, name)
		}
	}
	if *asJSON {
		return e.printJSON(map[string]any{"deleted": pos})
	}
	return nil
}

// humanBytes writes n bytes with a binary unit: 512 B, 11.5 MiB.
func humanBytes(n int64) string {
	const unit = 1024
	if n < unit {
		return fmt.Sprintf("%d B", n)
	}
	f, i := float64(n)/unit, 0
	for f >= unit && i < 4 {
		f /= unit
		i++
	}
	return fmt.Sprintf("%.1f %ciB", f, "KMGTP"[i])
}
