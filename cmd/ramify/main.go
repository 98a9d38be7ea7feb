// Command ramify is the ramify server (`ramify serve`) and its command-line client (every other verb).
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"sort"
	"strings"
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

func usage() {
	fmt.Fprintln(os.Stderr, "ramify: a self-hosted sandbox server for AI agents\n\nUsage: ramify <command> [flags]\n\nCommands:")
	names := make([]string, 0, len(commands))
	for n, c := range commands {
		if !c.hidden {
			names = append(names, n)
		}
	}
	sort.Strings(names)
	for _, n := range names {
		fmt.Fprintf(os.Stderr, "  %-18s %s\n", n, commands[n].summary)
	}
	fmt.Fprintln(os.Stderr, "\nClients read RAMIFY_API_URL and RAMIFY_API_KEY. Run 'ramify <command> -h' for a command's flags.")
}

func main() {
	if len(os.Args) < 2 || os.Args[1] == "-h" || os.Args[1] == "--help" || os.Args[1] == "help" {
		usage()
		os.Exit(2)
	}
	name, args := os.Args[1], os.Args[2:]
	// Two-word verbs: "sandbox create", "image build".
	if len(args) > 0 {
		if _, ok := commands[name+" "+args[0]]; ok {
			name, args = name+" "+args[0], args[1:]
		}
	}
	c, ok := commands[name]
	if !ok {
		fmt.Fprintf(os.Stderr, "ramify: unknown command %q\n\n", strings.Join(os.Args[1:2], " "))
		usage()
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := c.run(ctx, args)
	stop()
	if err != nil {
		fmt.Fprintf(os.Stderr, "ramify: %v\n", err)
		os.Exit(1)
	}
}
