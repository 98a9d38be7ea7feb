package main

import (
	"context"
	"flag"
	"fmt"
	"os"

	"github.com/ramify-dev/ramify/client"
	"github.com/ramify-dev/ramify/internal/mcpserver"
)

func init() {
	register("mcp", "serve ramify's API as MCP tools over stdio (for AI agents and MCP hosts)", runMCP)
}

// runMCP serves the MCP tools of package mcpserver on stdin / stdout. Stdout carries the protocol only;
// anything else goes to stderr.
func runMCP(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("mcp", flag.ContinueOnError)
	fs.Usage = func() {
		fmt.Fprintln(os.Stderr, "Usage: ramify mcp\n\nServes the Model Context Protocol over stdin/stdout: the tools create, run code in, exec in,\n"+
			"read/write files of, fork, diff, merge, pause, resume and destroy sandboxes of the server at\n"+
			"RAMIFY_API_URL, authenticating with RAMIFY_API_KEY. Configure it in an MCP host as the command 'ramify mcp'.")
	}
	if err := fs.Parse(args); err != nil {
		if err == flag.ErrHelp {
			return nil
		}
		return err
	}
	if fs.NArg() > 0 {
		fs.Usage()
		return fmt.Errorf("mcp takes no arguments")
	}
	c, err := client.FromEnv(client.WithUserAgent("ramify-mcp/" + version))
	if err != nil {
		return err
	}
	return mcpserver.Run(ctx, c, version)
}
