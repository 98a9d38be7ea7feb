package mcpserver

import (
	"encoding/json"
	"fmt"

	"github.com/google/jsonschema-go/jsonschema"
)

// The input schemas that need more than what is inferred from the Go types: the API's enums, bounds and
// defaults (the same as the server's checks in internal/sandbox, so that a model sees them before it calls).
// The SDK validates arguments against them and fills in the defaults.

// maxRunTimeoutS is the largest timeout_s of run_code and exec the server takes.
const maxRunTimeoutS = 86400

// statuses are the values of a sandbox's status.
var statuses = []any{"creating", "running", "pausing", "paused", "resuming", "error"}

// inputSchema infers T's schema and applies edits to its properties; an edit of a property T does not have is a
// programming error.
func inputSchema[T any](edits map[string]func(*jsonschema.Schema)) *jsonschema.Schema {
	s, err := jsonschema.For[T](nil)
	if err != nil {
		panic(fmt.Sprintf("mcpserver: schema of %T: %v", *new(T), err))
	}
	for name, edit := range edits {
		p, ok := s.Properties[name]
		if !ok {
			panic(fmt.Sprintf("mcpserver: %T has no property %q", *new(T), name))
		}
		edit(p)
	}
	return s
}

func between(lo, hi float64) func(*jsonschema.Schema) {
	return func(s *jsonschema.Schema) { s.Minimum, s.Maximum = &lo, &hi }
}

func atLeast(lo float64) func(*jsonschema.Schema) {
	return func(s *jsonschema.Schema) { s.Minimum = &lo }
}

func oneOf(values ...any) func(*jsonschema.Schema) {
	return func(s *jsonschema.Schema) { s.Enum = values }
}

// withDefault sets a property's default (which the SDK fills in when the argument is omitted) after edit.
func withDefault(v any, edit func(*jsonschema.Schema)) func(*jsonschema.Schema) {
	b, err := json.Marshal(v)
	if err != nil {
		panic(err)
	}
	return func(s *jsonschema.Schema) {
		if edit != nil {
			edit(s)
		}
		s.Default = b
	}
}

func createSandboxSchema() *jsonschema.Schema {
	return inputSchema[CreateSandboxInput](map[string]func(*jsonschema.Schema){
		"vcpu":       between(0.1, 64),
		"mem_mib":    between(64, 262144),
		"max_procs":  between(16, 65536),
		"disk_mib":   between(64, 1<<20),
		"timeout_s":  between(0, 30*24*3600),
		"on_timeout": oneOf("destroy", "pause"),
	})
}

func listSandboxesSchema() *jsonschema.Schema {
	return inputSchema[ListSandboxesInput](map[string]func(*jsonschema.Schema){"status": oneOf(statuses...)})
}

func runCodeSchema() *jsonschema.Schema {
	return inputSchema[RunCodeInput](map[string]func(*jsonschema.Schema){"timeout_s": between(0, maxRunTimeoutS)})
}

func execSchema() *jsonschema.Schema {
	return inputSchema[ExecInput](map[string]func(*jsonschema.Schema){"timeout_s": between(0, maxRunTimeoutS)})
}

func readFileSchema() *jsonschema.Schema {
	return inputSchema[ReadFileInput](map[string]func(*jsonschema.Schema){
		"offset": withDefault(0, atLeast(0)),
		"limit":  withDefault(MaxTextBytes, between(1, MaxReadBytes)),
	})
}

func forkSchema() *jsonschema.Schema {
	return inputSchema[ForkInput](map[string]func(*jsonschema.Schema){"n": withDefault(1, between(1, 32))})
}

// lifecycleSchema is pause's and resume's: wait (for the status target) is true unless said otherwise.
func lifecycleSchema(target string) *jsonschema.Schema {
	return inputSchema[LifecycleInput](map[string]func(*jsonschema.Schema){
		"wait": withDefault(true, func(s *jsonschema.Schema) {
			s.Description = fmt.Sprintf("wait until the sandbox is %s (up to 5 minutes; default true); false returns at once", target)
		}),
	})
}
