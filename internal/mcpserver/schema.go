package mcpserver

import (
	"encoding/json"
	"fmt"
	"reflect"
	"slices"

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
	portable(s, true)
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

// edits are the changes to one tool's inferred input schema, by property.
type edits = map[string]func(*jsonschema.Schema)

var createSandboxEdits = edits{
	"vcpu":       between(0.1, 64),
	"mem_mib":    between(64, 262144),
	"max_procs":  between(16, 65536),
	"disk_mib":   between(64, 1<<20),
	"timeout_s":  between(0, 30*24*3600),
	"on_timeout": oneOf("destroy", "pause"),
}

var listSandboxesEdits = edits{"status": oneOf(statuses...)}

var runEdits = edits{"timeout_s": between(0, maxRunTimeoutS)} // run_code's and exec's

var setTimeoutEdits = edits{"timeout_s": between(0, 30*24*3600)}

var interruptEdits = edits{"what": oneOf("run_code", "exec")}

var readFileEdits = edits{
	"offset": withDefault(0, atLeast(0)),
	"limit":  withDefault(MaxTextBytes, between(1, MaxReadBytes)),
}

var forkEdits = edits{"n": withDefault(1, between(1, 32))}

// lifecycleEdits are pause's and resume's: wait (for the status target) is true unless said otherwise.
func lifecycleEdits(target string) edits {
	return edits{
		"wait": withDefault(true, func(s *jsonschema.Schema) {
			s.Description = fmt.Sprintf("wait until the sandbox is %s (up to 5 minutes; default true); false returns at once", target)
		}),
	}
}

// outputSchema infers the schema of a tool's result (of what Out points to, when a pointer).
func outputSchema[Out any]() *jsonschema.Schema {
	rt := reflect.TypeFor[Out]()
	if rt.Kind() == reflect.Pointer {
		rt = rt.Elem()
	}
	s, err := jsonschema.ForType(rt, nil)
	if err != nil {
		panic(fmt.Sprintf("mcpserver: schema of %v: %v", rt, err))
	}
	portable(s, false)
	return s
}

// portable rewrites the nullable types inferred from Go pointers, slices and maps (`"type": ["null", "array"]`),
// which clients mapping schemas onto a single-type dialect (Gemini's function declarations, the MCP inspector's
// --strict check) reject or misread. In inputs, where null means nothing more than leaving the argument out, the
// null goes; in outputs, where null is a value (no value, no error), it becomes `anyOf: [{"type": "null"}, {...}]`.
func portable(s *jsonschema.Schema, input bool) {
	if s == nil {
		return
	}
	for _, p := range s.Properties {
		portable(p, input)
	}
	for _, d := range s.Defs {
		portable(d, input)
	}
	portable(s.Items, input)
	portable(s.AdditionalProperties, input)
	if len(s.Types) != 2 || !slices.Contains(s.Types, "null") {
		return
	}
	other := s.Types[0]
	if other == "null" {
		other = s.Types[1]
	}
	if input {
		s.Types, s.Type = nil, other
		return
	}
	branch := *s
	branch.Types, branch.Type, branch.Description, branch.Default = nil, other, "", nil
	*s = jsonschema.Schema{Description: s.Description, AnyOf: []*jsonschema.Schema{{Type: "null"}, &branch}}
}
