// Package mcpserver owns ramify's Model Context Protocol server (`ramify mcp`): it exposes the REST API as MCP
// tools (sandboxes, run_code, exec, files, fork / merge_into / diff, pause / resume), each a thin typed wrapper
// over package client, and serves them over stdio with the official Go MCP SDK. Failures of the API (an unknown
// sandbox, a bad argument, a conflict, an unreachable server) come back as MCP tool errors whose message says
// what to do, never as protocol errors, so that the model calling the tool can read them and correct itself.
// The tools' input schemas carry the API's enums and bounds, and their annotations say which tools only read.
// Long outputs are cut to MaxTextBytes (see output.go) and relative paths resolve against the sandbox's cwd.
package mcpserver

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/ramify-dev/ramify/client"
)

// New returns an MCP server named "ramify" whose tools call the ramify server through c.
func New(c *client.Client, version string) *mcp.Server {
	s := mcp.NewServer(&mcp.Implementation{Name: "ramify", Title: "ramify sandboxes", Version: version}, &mcp.ServerOptions{
		Instructions: "ramify runs isolated Linux sandboxes with a persistent Python interpreter. Create a sandbox " +
			"(create_sandbox), run Python in it (run_code: variables persist between calls) or shell commands (exec), " +
			"read and write its files, fork it to try alternatives in parallel, compare forks (diff), keep the best " +
			"one (merge_into), pause or resume it, save it as a template to start new sandboxes from (save_template), and destroy it when done.",
	})
	t := &tools{c: c}
	for _, add := range []func(*mcp.Server){
		tool("create_sandbox", "Create sandbox", createSandboxEdits, additive(false), t.createSandbox,
			"Create a sandbox and return it (its id is needed by every other tool). Omitted fields take the server's defaults."),
		tool("list_sandboxes", "List sandboxes", listSandboxesEdits, readOnly(), t.listSandboxes,
			"List the sandboxes, optionally filtered by status and metadata."),
		tool("get_sandbox", "Get sandbox", nil, readOnly(), t.getSandbox,
			"Return one sandbox (status, resources, cwd, metadata, last pause)."),
		tool("destroy_sandbox", "Destroy sandbox", nil, destructive(true, false), t.destroySandbox,
			"Destroy a sandbox: its processes are killed and its file system removed."),
		tool("run_code", "Run Python", runEdits, destructive(false, true), t.runCode,
			"Run Python code in the sandbox's persistent interpreter (variables, imports and functions persist between calls). "+
				"Returns stdout, stderr, the repr of a trailing expression (value) and the exception (error), if any. "+
				"Rich results (matplotlib figures, plt.show(), display(), objects with _repr_png_ or _repr_markdown_) come as image and text content. "+
				fmt.Sprintf("An output over %d KiB is cut in the middle and saved whole in a file of the sandbox (see truncated).", MaxTextBytes>>10)),
		tool("exec", "Run a command", runEdits, destructive(false, true), t.exec,
			"Run a command in the sandbox: cmd (run by /bin/sh -c) or argv. Returns the exit code and output; a non-zero exit code is not a tool error. "+
				fmt.Sprintf("An output over %d KiB is cut in the middle and saved whole in a file of the sandbox (see truncated).", MaxTextBytes>>10)),
		tool("read_file", "Read a file", readFileEdits, readOnly(), t.readFile,
			fmt.Sprintf("Read a file of the sandbox, at most limit bytes (default %d KiB) from offset; next_offset is set when more follows. ", MaxTextBytes>>10)+
				"UTF-8 text is returned as is; other content is base64-encoded with base64=true. "+
				"path is absolute, or relative to the sandbox's cwd (where exec runs and the interpreter starts; /root by default)."),
		tool("write_file", "Write a file", nil, destructive(true, false), t.writeFile,
			"Write (create or replace) a file of the sandbox, creating parent directories. Set base64=true when content is base64-encoded binary. "+
				"path is absolute, or relative to the sandbox's cwd."),
		tool("list_files", "List a directory", nil, readOnly(), t.listFiles,
			"List a directory of the sandbox, sorted by name. path is absolute, or relative to the sandbox's cwd (default: the cwd itself)."),
		tool("fork", "Fork sandbox", forkEdits, additive(false), t.fork,
			"Fork a sandbox into n children (1-32), each starting from the parent's current state: interpreter variables and file system. The parent keeps running. Returns the children's ids."),
		tool("merge_into", "Merge a winner into its parent", nil, destructive(false, false), t.mergeInto,
			"Commit a winner's state (typically a fork's) into parent: afterwards parent's id drives what was winner (its interpreter and files; parent's own state is discarded), and winner's id is retired. Siblings are not touched."),
		tool("diff", "Compare two sandboxes' files", nil, readOnly(), t.diff,
			"Compare the files of sandboxes a and b (typically two forks) under paths (default /root and /tmp): added are files only in b, removed files only in a, modified files whose content differs."),
		tool("pause", "Pause sandbox", lifecycleEdits("paused"), destructive(true, false), t.pause,
			"Pause a running sandbox: it stops using CPU and memory; its interpreter's variables and its files are kept, other processes are not (the result's pause.not_saved lists what was lost). "+
				"Waits until it is paused unless wait=false."),
		tool("resume", "Resume sandbox", lifecycleEdits("running"), additive(true), t.resume,
			"Resume a paused sandbox. Waits until it is running unless wait=false."),
		tool("set_timeout", "Keep sandbox alive", setTimeoutEdits, additive(true), t.setTimeout,
			"Set when a running or paused sandbox times out: timeout_s seconds from now (0 = never), then its on_timeout action (destroy or pause)."),
		tool("save_template", "Save sandbox as template", nil, additive(false), t.saveTemplate,
			"Capture a running sandbox's files and Python variables (data loaded, libraries imported, models in memory) as a named template; the sandbox keeps running. "+
				"create_sandbox with template starts new sandboxes from it, each with that state. The result's not_saved lists variables that could not be saved."),
		tool("list_templates", "List templates", nil, readOnly(), t.listTemplates,
			"List the templates (name, size, the sandbox each was captured from)."),
		tool("delete_template", "Delete template", nil, destructive(false, false), t.deleteTemplate,
			"Delete a template; sandboxes created from it are not affected."),
		tool("interrupt", "Interrupt running code", interruptEdits, destructive(true, false), t.interrupt,
			"Stop the run_code and exec calls running in a sandbox (e.g. one stuck in a loop, called while it runs): "+
				"the Python code gets a KeyboardInterrupt (its variables survive), commands are killed. Returns how many calls were stopped."),
	} {
		add(s)
	}
	return s
}

// tool returns a function adding one tool to a server. Its schemas are inferred from In and Out, with edits to
// the input's properties (schema.go).
func tool[In, Out any](name, title string, e edits, ann *mcp.ToolAnnotations, h mcp.ToolHandlerFor[In, Out], desc string) func(*mcp.Server) {
	ann.Title = title
	t := &mcp.Tool{Name: name, Title: title, Description: desc, Annotations: ann,
		InputSchema: inputSchema[In](e), OutputSchema: outputSchema[Out]()}
	return func(s *mcp.Server) { mcp.AddTool(s, t, h) }
}

// Run serves the tools over stdin / stdout until the client disconnects or ctx is cancelled.
func Run(ctx context.Context, c *client.Client, version string) error {
	err := New(c, version).Run(ctx, &mcp.StdioTransport{})
	if err != nil && (errors.Is(err, io.EOF) || ctx.Err() != nil) {
		return nil
	}
	return err
}

// The annotations. No tool reaches outside the ramify server but run_code and exec, whose code and commands may
// use the network (openWorldHint).

// readOnly: the tool changes nothing, so calling it again is harmless.
func readOnly() *mcp.ToolAnnotations {
	return &mcp.ToolAnnotations{ReadOnlyHint: true, IdempotentHint: true, OpenWorldHint: ptr(false)}
}

// additive: the tool adds (a sandbox, a fork's children, a running interpreter) without losing anything.
func additive(idempotent bool) *mcp.ToolAnnotations {
	return &mcp.ToolAnnotations{DestructiveHint: ptr(false), IdempotentHint: idempotent, OpenWorldHint: ptr(false)}
}

// destructive: the tool may lose state (a sandbox, a file's old content, whatever code does).
func destructive(idempotent, openWorld bool) *mcp.ToolAnnotations {
	return &mcp.ToolAnnotations{DestructiveHint: ptr(true), IdempotentHint: idempotent, OpenWorldHint: ptr(openWorld)}
}

func ptr[T any](v T) *T { return &v }
