package main

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"strings"
	"text/tabwriter"

	"github.com/ramify-dev/ramify/client"
)

func init() {
	registerClient("image ls", "list images (NAME SIZE SANDBOXES BUILT CONTENTS)", (*cli).imageLs)
	registerClient("image get", "show one image", (*cli).imageGet)
	registerClient("image rm", "delete named images (refused while sandboxes or templates use them)", (*cli).imageRm)
}

// namedBuild reports whether an "image build" command line names an image: then it is a client verb (the
// server builds the image), else the local build of the default image.
func namedBuild(args []string) bool {
	for _, a := range args {
		if a == "--" {
			return false
		}
		if a == "--name" || a == "-name" || strings.HasPrefix(a, "--name=") || strings.HasPrefix(a, "-name=") {
			return true
		}
	}
	return false
}

func (e *cli) imageBuildNamed(ctx context.Context, args []string) error {
	fs, asJSON := e.flags("image build --name NAME [--apt pkg,pkg] [--apt-file F] [--pip req]... [--requirements F] [--pip-index URL] [--json]")
	name := fs.String("name", "", "the image's name (1 to 63 of a-z, 0-9, '_', '.', '-')")
	var apt commaList
	var pip listFlag
	fs.Var(&apt, "apt", "Debian packages to install, comma-separated (repeatable); python3-* packages need no pip index")
	aptFile := fs.String("apt-file", "", "a file of Debian packages, one per line (# comments)")
	fs.Var(&pip, "pip", `a pip requirement ("name", "name==1.2"; repeatable)`)
	reqFile := fs.String("requirements", "", "a requirements file: one requirement per line (# comments; no options or URLs)")
	index := fs.String("pip-index", os.Getenv("RAMIFY_PIP_INDEX"), "the package index pip installs from, as the server reaches it (a PEP 503 simple index URL; env RAMIFY_PIP_INDEX)")
	from := fs.String("from", "default", "the image to build on: only the default image")
	pos, _, _, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 0 {
		return usageError(fs, "image build takes no positional arguments (got %q)", pos)
	}
	if *from != "default" {
		return usageError(fs, "--from: named images are built on the default image only (got %q)", *from)
	}
	for _, f := range []struct {
		path string
		into *[]string
	}{{*aptFile, (*[]string)(&apt)}, {*reqFile, (*[]string)(&pip)}} {
		if f.path == "" {
			continue
		}
		lines, err := readList(f.path)
		if err != nil {
			return err
		}
		*f.into = append(*f.into, lines...)
	}
	req := client.BuildImageRequest{Name: *name, Apt: apt, Pip: pip, PipIndex: *index}
	img, err := e.c.BuildImage(ctx, req, func(line string) { fmt.Fprintln(e.stderr, line) })
	if err != nil {
		return err
	}
	if *asJSON {
		return e.printJSON(img)
	}
	fmt.Fprintln(e.stdout, img.Name)
	fmt.Fprintf(e.stderr, "image %s ready (%s of its own)\n  run a sandbox on it: ramify sandbox create --image %s\n", img.Name, humanBytes(img.SizeBytes), img.Name)
	return nil
}

// commaList is a repeatable, comma-separated flag.
type commaList []string

func (l *commaList) String() string { return strings.Join(*l, ",") }

func (l *commaList) Set(v string) error {
	for _, x := range strings.Split(v, ",") {
		if x = strings.TrimSpace(x); x != "" {
			*l = append(*l, x)
		}
	}
	return nil
}

// readList reads a file of one item per line, skipping blank lines and # comments.
func readList(path string) ([]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if i := strings.Index(line, " #"); i >= 0 {
			line = strings.TrimSpace(line[:i])
		}
		if line != "" && !strings.HasPrefix(line, "#") {
			out = append(out, line)
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read %s: %w", path, err)
	}
	return out, nil
}

func (e *cli) imageLs(ctx context.Context, args []string) error {
	fs, asJSON := e.flags("image ls [--json]")
	pos, _, _, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 0 {
		return usageError(fs, "image ls takes no positional arguments (got %q)", pos)
	}
	imgs, err := e.c.Images(ctx)
	if err != nil {
		return err
	}
	if *asJSON {
		if imgs == nil {
			imgs = []client.Image{}
		}
		return e.printJSON(map[string]any{"images": imgs})
	}
	tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "NAME\tSIZE\tSANDBOXES\tBUILT\tCONTENTS")
	for _, img := range imgs {
		contents := strings.Join(append(append([]string{}, img.Apt...), img.Pip...), " ")
		if img.Default {
			contents = "(the default image)"
		}
		if img.Error != "" {
			contents = "unusable: " + img.Error
		}
		fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\n", img.Name, humanBytes(img.SizeBytes), img.Sandboxes, humanAge(e.now().Sub(img.BuiltAt)), contents)
	}
	return tw.Flush()
}

func (e *cli) imageGet(ctx context.Context, args []string) error {
	fs, _ := e.flags("image get <name> [--json]")
	pos, _, _, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	if len(pos) != 1 {
		return usageError(fs, "image get takes one name (got %q)", pos)
	}
	img, err := e.c.GetImage(ctx, pos[0])
	if err != nil {
		return err
	}
	return e.printJSON(img)
}

func (e *cli) imageRm(ctx context.Context, args []string) error {
	fs, asJSON := e.flags("image rm <name>... [--json]")
	pos, _, _, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	if len(pos) == 0 {
		return usageError(fs, "image rm takes one or more names")
	}
	for _, n := range pos {
		if err := e.c.DeleteImage(ctx, n); err != nil {
			return err
		}
		if !*asJSON {
			fmt.Fprintf(e.stderr, "deleted image %s\n", n)
		}
	}
	if *asJSON {
		return e.printJSON(map[string]any{"deleted": pos})
	}
	return nil
}
