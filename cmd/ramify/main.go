// Command ramify is the ramify server (`ramify serve`) and its command-line client (every other verb).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"sort"
	"syscall"
)

// command is one CLI verb. run gets the arguments after the verb.
type command struct {
	summary string
	run     func(ctx context.Context, args []string) error
	hidden  bool
}

var commands = map[string]command{}

// register adds a verb; files of this package call it from init.
func register(name, summary string, run func(ctx context.Context, args []string) error) {
	commands[name] = command{summary: summary, run: run}
}

func registerHidden(name string, run func(ctx context.Context, args []string) error) {
	commands[name] = command{run: run, hidden: true}
}

// usage prints the list of commands to w.
func usage(w io.Writer) {
	fmt.Fprintln(w, "ramify: a self-hosted sandbox server for AI agents\n\nUsage: ramify <command> [flags]\n\nCommands:")
	names := make([]string, 0, len(commands))
	for n, c := range commands {
		if !c.hidden {
			names = append(names, n)
		}
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(w, "  %-18s %s\n", n, commands[n].summary)
	}
	fmt.Fprintln(w, "\nClients read RAMIFY_API_URL and RAMIFY_API_KEY. Run 'ramify <command> -h' for a command's flags,\n'ramify --version' for the version.")
}

// resolve finds the verb of a command line: one word, or two ("sandbox create", "image build").
func resolve(args []string) (name string, rest []string, ok bool) {
	if len(args) == 0 {
		return "", nil, false
	}
	if len(args) > 1 {
		if _, ok := commands[args[0]+" "+args[1]]; ok {
			return args[0] + " " + args[1], args[2:], true
		}
	}
	_, ok = commands[args[0]]
	return args[0], args[1:], ok
}

func main() {
	args := os.Args[1:]
	switch {
	case len(args) == 0:
		usage(os.Stderr)
		os.Exit(2)
	case args[0] == "-h" || args[0] == "--help" || args[0] == "-help" || args[0] == "help" && len(args) == 1:
		usage(os.Stdout)
		return
	case args[0] == "--version" || args[0] == "-version" || args[0] == "version":
		fmt.Printf("ramify %s\n", version)
		return
	case args[0] == "help":
		// "ramify help exec" is "ramify exec -h".
		args = append(args[1:], "-h")
	}
	name, args, ok := resolve(args)
	if !ok {
		fmt.Fprintf(os.Stderr, "ramify: unknown command %q\n\n", name)
		usage(os.Stderr)
		os.Exit(2)
	}
	c := commands[name]
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := c.run(ctx, args)
	stop()
	switch {
	case err == nil:
	case errors.Is(err, flag.ErrHelp): // -h: the flag package printed the usage
	default:
		fmt.Fprintf(os.Stderr, "ramify: %v\n", err)
		os.Exit(1)
	}
}
