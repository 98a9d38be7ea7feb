package main

import (
	"context"
	"fmt"
	"io"
	"maps"
	"slices"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/ramify-dev/ramify/client"
)

func init() {
	registerClient("sandbox create", "create a sandbox and print its id", (*cli).sandboxCreate)
	registerClient("ls", "list sandboxes (ID STATUS IP SHAPE AGE PARENT)", (*cli).ls)
	registerClient("get", "show one sandbox", (*cli).get)
	registerClient("set-timeout", "keep a sandbox alive: it now times out after this long from now (0 = never)", (*cli).setTimeout)
	registerClient("rm", "delete sandboxes", (*cli).rm)
	registerClient("tree", "draw a sandbox's fork family as a tree (all families without an id)", (*cli).tree)
	registerClientHidden("sandbox ls", (*cli).ls)
	registerClientHidden("sandbox get", (*cli).get)
	registerClientHidden("sandbox rm", (*cli).rm)
}

func (e *cli) sandboxCreate(ctx context.Context, args []string) error {
	fs, asJSON := e.flags("sandbox create [--vcpu N] [--mem MiB] [--max-procs N] [--disk MiB] [--egress LIST] [--ingress] [--timeout S] [--env K=V]... [--cwd DIR] [--meta K=V]... [--template NAME] [--ssh-key FILE]... [--json]")
	var (
		mem     memFlag
		timeout secondsFlag
		env     = kvFlag{}
		meta    = kvFlag{}
	)
	vcpu := fs.Float64("vcpu", 0, "CPU quota in cores, 0.1 .. 64 (server default 1)")
	fs.Var(&mem, "mem", "memory limit in MiB, or with a unit: 512M, 2G (server default 1024)")
	maxProcs := fs.Int("max-procs", 0, "max processes and threads (server default 512)")
	var disk memFlag
	fs.Var(&disk, "disk", "disk quota in MiB, or with a unit: 512M, 20G (server default: its --disk-mib)")
	egress := fs.String("egress", "", `outbound allowlist: comma-separated CIDRs, IPs or hostnames, each optionally with :port; "none" for no outbound traffic (server default: the public internet only)`)
	ingress := fs.Bool("ingress", false, "make the sandbox's ports reachable over HTTP: through the server's ingress listener (--ingress-listen) and /v1/sandboxes/{id}/ports/{port}/")
	fs.Var(&timeout, "timeout", "destroy (or pause, see --on-timeout) the sandbox after this many seconds or this duration (5m); 0 = never")
	onTimeout := fs.String("on-timeout", "", `what --timeout does: "destroy" (default) or "pause"`)
	fs.Var(env, "env", "environment variable K=V for run and exec (repeatable)")
	cwd := fs.String("cwd", "", "working directory (server default /root)")
	fs.Var(meta, "meta", "metadata label K=V (repeatable)")
	var sshKeys stringsFlag
	fs.Var(&sshKeys, "ssh-key", "authorize this SSH public key (a .pub file or a key line) for 'ramify ssh' (repeatable)")
	template := fs.String("template", "", "start from this template (ramify template save): its files, variables and, for flags not given, its settings")
	img := fs.String("image", "", "run on this image (ramify image build --name; ramify image ls); default: the default image")
	pos, _, _, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 0 {
		return usageError(fs, "sandbox create takes no positional arguments (got %q)", pos)
	}
	req := client.CreateRequest{
		VCPU: *vcpu, MemMiB: int(mem), MaxProcs: *maxProcs, TimeoutS: timeout.n, OnTimeout: *onTimeout,
		Cwd: *cwd, IngressEnabled: *ingress, Template: *template, Image: *img,
	}
	if req.SSHPubkeys, err = readPubkeys(sshKeys); err != nil {
		return err
	}
	req.DiskMiB = int(disk)
	switch {
	case *egress == "none":
		req.Egress = []string{}
	case *egress != "":
		req.Egress = strings.Split(*egress, ",")
	}
	if len(env) > 0 {
		req.Env = env
	}
	if len(meta) > 0 {
		req.Metadata = meta
	}
	sb, err := e.c.Create(ctx, req)
	if err != nil {
		return err
	}
	if *asJSON {
		return e.printJSON(sb)
	}
	fmt.Fprintln(e.stdout, sb.ID)
	fmt.Fprintf(e.stderr, "created %s (%s, %s, %s)\n  run code:      ramify run %s 'print(1)'\n  run a command: ramify exec %s -- ls -l\n  remove it:     ramify rm %s\n",
		sb.ID, sb.Status, orDash(sb.IP), orDash(sb.Shape), sb.ID, sb.ID, sb.ID)
	if sb.Ingress.Enabled {
		fmt.Fprintf(e.stderr, "  its ports:     %s\n", ingressWhere(e.c.BaseURL(), sb.Ingress))
	}
	if sb.SSH != nil && len(sb.SSH.Keys) > 0 {
		if sb.SSH.Command != "" {
			fmt.Fprintf(e.stderr, "  ssh into it:   ramify ssh %s   (or %s)\n", sb.ID, sb.SSH.Command)
		} else {
			fmt.Fprintf(e.stderr, "  ssh:           the server runs no SSH server (ramify serve --ssh-listen)\n")
		}
	}
	return nil
}

// ingressWhere says where an ingress-enabled sandbox's ports are: the ingress listener's URL template, else the
// API's route (which needs the key).
func ingressWhere(base string, g client.Ingress) string {
	if g.URLTemplate != "" {
		return g.URLTemplate
	}
	return base + g.PathTemplate + " (with the API key)"
}

func (e *cli) ls(ctx context.Context, args []string) error {
	fs, asJSON := e.flags("ls [--status S] [--meta K=V]... [--json]")
	status := fs.String("status", "", "only sandboxes in this status")
	meta := kvFlag{}
	fs.Var(meta, "meta", "only sandboxes with metadata K=V (repeatable; all must match)")
	pos, _, _, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 0 {
		return usageError(fs, "ls takes no positional arguments")
	}
	list, err := e.c.List(ctx, client.ListOptions{Status: *status, Metadata: meta})
	if err != nil {
		return err
	}
	sortSandboxes(list)
	if *asJSON {
		return e.printJSON(list)
	}
	writeTable(e.stdout, list, e.now())
	return nil
}

// sortSandboxes orders by creation time, then id.
func sortSandboxes(list []client.Sandbox) {
	sort.SliceStable(list, func(i, j int) bool {
		if !list[i].CreatedAt.Equal(list[j].CreatedAt) {
			return list[i].CreatedAt.Before(list[j].CreatedAt)
		}
		return list[i].ID < list[j].ID
	})
}

// writeTable prints the ls table.
func writeTable(w io.Writer, list []client.Sandbox, now time.Time) {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "ID\tSTATUS\tIP\tSHAPE\tAGE\tPARENT")
	for _, sb := range list {
		age := "-"
		if !sb.CreatedAt.IsZero() {
			age = humanAge(now.Sub(sb.CreatedAt))
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\n", sb.ID, sb.Status, orDash(sb.IP), orDash(sb.Shape), age, orDash(sb.ParentID))
	}
	tw.Flush()
}

func (e *cli) get(ctx context.Context, args []string) error {
	fs, asJSON := e.flags("get <id> [--json]")
	pos, _, _, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return usageError(fs, "get takes one sandbox id")
	}
	sb, err := e.c.Get(ctx, pos[0])
	if err != nil {
		return err
	}
	if *asJSON {
		return e.printJSON(sb)
	}
	writeSandbox(e.stdout, sb, e.now())
	return nil
}

func (e *cli) setTimeout(ctx context.Context, args []string) error {
	fs, asJSON := e.flags("set-timeout <id> <seconds | duration like 10m> [--json]")
	pos, rest, _, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	pos = append(pos, rest...)
	if len(pos) != 2 {
		return usageError(fs, "set-timeout takes a sandbox id and a timeout")
	}
	var t secondsFlag
	if err := t.Set(pos[1]); err != nil {
		return usageError(fs, "set-timeout: %v", err)
	}
	sb, err := e.c.SetTimeout(ctx, pos[0], t.n)
	if err != nil {
		return err
	}
	if *asJSON {
		return e.printJSON(sb)
	}
	if sb.ExpiresAt == nil {
		fmt.Fprintf(e.stdout, "%s: no timeout\n", sb.ID)
		return nil
	}
	fmt.Fprintf(e.stdout, "%s: times out at %s (in %s), then %s\n", sb.ID, sb.ExpiresAt.Local().Format(time.DateTime),
		sb.ExpiresAt.Sub(e.now()).Round(time.Second), orDash(sb.OnTimeout))
	return nil
}

// writeSandbox prints one sandbox as "key: value" lines.
func writeSandbox(w io.Writer, sb *client.Sandbox, now time.Time) {
	tw := tabwriter.NewWriter(w, 0, 0, 1, ' ', 0)
	row := func(k, v string) { fmt.Fprintf(tw, "%s:\t%s\n", k, v) }
	row("id", sb.ID)
	row("status", sb.Status)
	if sb.Error != "" {
		row("error", sb.Error)
	}
	row("ip", orDash(sb.IP))
	row("hostname", orDash(sb.Hostname))
	row("shape", fmt.Sprintf("%s (%g vcpu, %d MiB, %d procs)", orDash(sb.Shape), sb.VCPU, sb.MemMiB, sb.MaxProcs))
	row("cwd", orDash(sb.Cwd))
	row("image", orDash(sb.Image))
	if !sb.CreatedAt.IsZero() {
		row("created", fmt.Sprintf("%s (%s ago)", sb.CreatedAt.Local().Format(time.DateTime), humanAge(now.Sub(sb.CreatedAt))))
	}
	if sb.TimeoutS > 0 {
		t := fmt.Sprintf("%ds, then %s", sb.TimeoutS, orDash(sb.OnTimeout))
		if sb.ExpiresAt != nil {
			t += " at " + sb.ExpiresAt.Local().Format(time.DateTime)
		}
		row("timeout", t)
	} else {
		row("timeout", "none")
	}
	row("family", orDash(sb.FamilyID))
	row("parent", orDash(sb.ParentID))
	if sb.ForkedFrom != "" && sb.ForkedFrom != sb.ParentID {
		row("forked from", sb.ForkedFrom)
	}
	var kv []string
	for _, k := range slices.Sorted(maps.Keys(sb.Metadata)) {
		kv = append(kv, k+"="+sb.Metadata[k])
	}
	row("metadata", orDash(strings.Join(kv, " ")))
	if u := sb.Usage; u != nil {
		disk := "-"
		if u.DiskBytes != nil {
			disk = fmt.Sprintf("%.1f MiB", float64(*u.DiskBytes)/(1<<20))
			if sb.DiskMiB > 0 {
				disk += fmt.Sprintf(" of %d", sb.DiskMiB)
			}
		}
		row("usage", fmt.Sprintf("memory %.1f MiB of %d, cpu %.2fs, %d tasks of %d, disk %s", float64(u.MemBytes)/(1<<20),
			sb.MemMiB, u.CPUSeconds, u.Pids, sb.MaxProcs, disk))
		if u.OOMKills > 0 {
			row("oom kills", fmt.Sprint(u.OOMKills))
		}
	}
	tw.Flush()
}

func (e *cli) rm(ctx context.Context, args []string) error {
	fs, asJSON := e.flags("rm <id>... [--json]")
	pos, rest, _, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	ids := append(pos, rest...)
	if len(ids) == 0 {
		return usageError(fs, "rm takes one or more sandbox ids")
	}
	removed := []string{}
	failed := map[string]string{}
	for _, id := range ids {
		if err := e.c.Delete(ctx, id); err != nil {
			if ctx.Err() != nil {
				return err
			}
			failed[id] = e.explain(err).Error()
			if !*asJSON {
				fmt.Fprintf(e.stderr, "ramify: %s: %s\n", id, failed[id])
			}
			continue
		}
		removed = append(removed, id)
		if !*asJSON {
			fmt.Fprintln(e.stdout, id)
		}
	}
	if *asJSON {
		if err := e.printJSON(map[string]any{"removed": removed, "failed": failed}); err != nil {
			return err
		}
	}
	if len(failed) > 0 {
		return exitStatus(1)
	}
	return nil
}

func (e *cli) tree(ctx context.Context, args []string) error {
	fs, asJSON := e.flags("tree [<id>] [--json]")
	pos, _, _, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	if len(pos) > 1 {
		return usageError(fs, "tree takes at most one sandbox id")
	}
	list, err := e.c.List(ctx, client.ListOptions{})
	if err != nil {
		return err
	}
	if len(pos) == 1 {
		list, err = family(list, pos[0])
		if err != nil {
			return err
		}
	}
	roots := buildForest(list)
	if *asJSON {
		return e.printJSON(roots)
	}
	fmt.Fprint(e.stdout, drawForest(roots))
	return nil
}

// family returns the sandboxes of id's fork family: those with its family_id, or, when the server gave none,
// id and its descendants.
func family(list []client.Sandbox, id string) ([]client.Sandbox, error) {
	var me *client.Sandbox
	for i := range list {
		if list[i].ID == id {
			me = &list[i]
		}
	}
	if me == nil {
		return nil, &client.APIError{StatusCode: 404, Message: "sandbox not found"}
	}
	var out []client.Sandbox
	if me.FamilyID != "" {
		for _, sb := range list {
			if sb.FamilyID == me.FamilyID {
				out = append(out, sb)
			}
		}
		return out, nil
	}
	in := map[string]bool{id: true}
	out = append(out, *me)
	for changed := true; changed; {
		changed = false
		for _, sb := range list {
			if !in[sb.ID] && in[sb.ParentID] {
				in[sb.ID] = true
				out = append(out, sb)
				changed = true
			}
		}
	}
	return out, nil
}

// treeNode is one sandbox of a drawn fork tree.
type treeNode struct {
	ID       string      `json:"id"`
	Status   string      `json:"status"`
	Children []*treeNode `json:"children"`
}

// buildForest links sandboxes by parent_id. Roots are the sandboxes whose parent is not in the list (created
// ones, and children whose parent was deleted or merged away). Siblings are in creation order.
func buildForest(list []client.Sandbox) []*treeNode {
	list = slices.Clone(list)
	sortSandboxes(list)
	nodes := make(map[string]*treeNode, len(list))
	for _, sb := range list {
		nodes[sb.ID] = &treeNode{ID: sb.ID, Status: sb.Status, Children: []*treeNode{}}
	}
	parent := make(map[string]string, len(list))
	for _, sb := range list {
		parent[sb.ID] = sb.ParentID
	}
	// inCycle guards against parent cycles in bad data: such sandboxes are drawn as roots.
	inCycle := func(id string) bool {
		for cur, steps := parent[id], 0; cur != "" && steps <= len(list); cur, steps = parent[cur], steps+1 {
			if cur == id {
				return true
			}
		}
		return false
	}
	roots := []*treeNode{}
	for _, sb := range list {
		n := nodes[sb.ID]
		if p, ok := nodes[sb.ParentID]; ok && !inCycle(sb.ID) {
			p.Children = append(p.Children, n)
			continue
		}
		roots = append(roots, n)
	}
	return roots
}

// drawForest draws trees like tree(1):
//
//	sbx_a (running)
//	├── sbx_b (running)
//	└── sbx_c (paused)
func drawForest(roots []*treeNode) string {
	var b strings.Builder
	var walk func(n *treeNode, prefix string)
	walk = func(n *treeNode, prefix string) {
		for i, c := range n.Children {
			branch, indent := "├── ", "│   "
			if i == len(n.Children)-1 {
				branch, indent = "└── ", "    "
			}
			fmt.Fprintf(&b, "%s%s%s (%s)\n", prefix, branch, c.ID, c.Status)
			walk(c, prefix+indent)
		}
	}
	for _, r := range roots {
		fmt.Fprintf(&b, "%s (%s)\n", r.ID, r.Status)
		walk(r, "")
	}
	return b.String()
}
