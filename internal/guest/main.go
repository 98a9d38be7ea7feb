// Command guest is the program ramify runs inside sandboxes: a family's init (`__init`, PID 1 of the family's
// PID namespace) and every sandbox's agent (`__agent`). `make build` links it on its own and embeds it in
// bin/ramify, which runs it from a sealed memfd (namespaces.sealedBinary). Linked without the server's libraries
// (HTTP API, S3, SQLite, Prometheus, SSH, MCP), whose package initialisation every process of the full binary
// runs, an agent starts in ~3 ms of CPU instead of ~11 and keeps ~1.5 MiB of private memory instead of ~3.2: a
// sandbox's agent is most of a fork child's private memory, and spare agents are started after every fork.
// bin/ramify built without it (a plain `go build`) runs its own `__init` and `__agent` verbs instead, the same
// code.
package main

import (
	"fmt"
	"os"
	goruntime "runtime"

	"github.com/ramify-dev/ramify/internal/agent"
	"github.com/ramify-dev/ramify/internal/runtime/namespaces"
)

func init() {
	// Nothing profiles a sandbox's init or agent: no heap profile buckets (they are ~1.4 MiB of address space,
	// part of it written, in every process).
	goruntime.MemProfileRate = 0
}

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "ramify's in-sandbox program: run by ramify serve as __init or __agent, not by hand")
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "__init":
		err = namespaces.InitMain(os.Args[2:])
	case "__agent":
		err = agent.Main(os.Args[2:])
	default:
		fmt.Fprintf(os.Stderr, "ramify's in-sandbox program: unknown role %q (want __init or __agent)\n", os.Args[1])
		os.Exit(2)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
}
