// Package mcpserver owns ramify's Model Context Protocol server (`ramify mcp`): it exposes the REST API as MCP
// tools (sandboxes, run_code, exec, files, fork / merge_into / diff, pause / resume), each a thin typed wrapper
// over package client, and serves them over stdio with the official Go MCP SDK. Failures of the API (an unknown
// sandbox, a bad argument, a conflict) come back as MCP tool errors carrying the server's message, never as
// protocol errors, so that the model calling the tool can read them and correct itself.
package mcpserver

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"time"
	"unicode/utf8"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/ramify-dev/ramify/client"
)

// MaxReadBytes is the largest file read_file returns; bigger files are an error (use exec to inspect them).
const MaxReadBytes = 8 << 20

// maxWait bounds the wait of pause and resume with wait=true.
const maxWait = 5 * time.Minute

// New returns an MCP server named "ramify" whose tools call the ramify server through c.
func New(c *client.Client, version string) *mcp.Server {
	s := mcp.NewServer(&mcp.Implementation{Name: "ramify", Title: "ramify sandboxes", Version: version}, &mcp.ServerOptions{
		Instructions: "ramify runs isolated Linux sandboxes with a persistent Python interpreter. Create a sandbox " +
			"(create_sandbox), run Python in it (run_code: variables persist between calls) or shell commands (exec), " +
			"read and write its files, fork it to try alternatives in parallel, compare forks (diff), keep the best " +
			"one (merge_into), pause or resume it, and destroy it when done.",
	})
	t := &tools{c: c}
	mcp.AddTool(s, &mcp.Tool{Name: "create_sandbox", Description: "Create a sandbox and return it (its id is needed by every other tool). Zero or omitted fields take the server's defaults."}, t.createSandbox)
	mcp.AddTool(s, &mcp.Tool{Name: "list_sandboxes", Description: "List the sandboxes, optionally filtered by status and metadata.", Annotations: readOnly()}, t.listSandboxes)
	mcp.AddTool(s, &mcp.Tool{Name: "get_sandbox", Description: "Return one sandbox (status, resources, metadata, last pause).", Annotations: readOnly()}, t.getSandbox)
	mcp.AddTool(s, &mcp.Tool{Name: "destroy_sandbox", Description: "Destroy a sandbox: its processes are killed and its file system removed.", Annotations: destructive()}, t.destroySandbox)
	mcp.AddTool(s, &mcp.Tool{Name: "run_code", Description: "Run Python code in the sandbox's persistent interpreter (variables, imports and functions persist between calls). Returns stdout, stderr, the repr of a trailing expression (value) and the exception (error), if any."}, t.runCode)
	mcp.AddTool(s, &mcp.Tool{Name: "exec", Description: "Run a command in the sandbox: cmd (run by /bin/sh -c) or argv. Returns the exit code and output; a non-zero exit code is not a tool error."}, t.exec)
	mcp.AddTool(s, &mcp.Tool{Name: "read_file", Description: fmt.Sprintf("Read a file of the sandbox. UTF-8 text is returned as is; other content is base64-encoded with base64=true. At most %d MiB.", MaxReadBytes>>20), Annotations: readOnly()}, t.readFile)
	mcp.AddTool(s, &mcp.Tool{Name: "write_file", Description: "Write a file of the sandbox (creating parent directories). Set base64=true when content is base64-encoded binary."}, t.writeFile)
	mcp.AddTool(s, &mcp.Tool{Name: "list_files", Description: "List a directory of the sandbox, sorted by name.", Annotations: readOnly()}, t.listFiles)
	mcp.AddTool(s, &mcp.Tool{Name: "fork", Description: "Fork a sandbox into n children (1-32), each starting from the parent's current state: interpreter variables and file system. The parent keeps running. Returns the children's ids."}, t.fork)
	mcp.AddTool(s, &mcp.Tool{Name: "merge_into", Description: "Commit a winner's state (typically a fork's) into parent: afterwards parent's id drives what was winner, and winner's id is retired. Siblings are not touched."}, t.mergeInto)
	mcp.AddTool(s, &mcp.Tool{Name: "diff", Description: "Compare the files of sandboxes a and b (typically two forks) under paths (default /root and /tmp): added are files only in b, removed files only in a, modified files whose content differs.", Annotations: readOnly()}, t.diff)
	mcp.AddTool(s, &mcp.Tool{Name: "pause", Description: "Pause a running sandbox (it stops using CPU; its state is kept). With wait=true, returns once it is paused."}, t.pause)
	mcp.AddTool(s, &mcp.Tool{Name: "resume", Description: "Resume a paused sandbox. With wait=true, returns once it is running."}, t.resume)
	return s
}

// Run serves the tools over stdin / stdout until the client disconnects or ctx is cancelled.
func Run(ctx context.Context, c *client.Client, version string) error {
	err := New(c, version).Run(ctx, &mcp.StdioTransport{})
	if err != nil && (errors.Is(err, io.EOF) || ctx.Err() != nil) {
		return nil
	}
	return err
}

func readOnly() *mcp.ToolAnnotations { return &mcp.ToolAnnotations{ReadOnlyHint: true} }

func destructive() *mcp.ToolAnnotations {
	t := true
	return &mcp.ToolAnnotations{DestructiveHint: &t}
}

type tools struct{ c *client.Client }

// sandbox returns sb with its nil collections made empty, so that it matches the tools' output schema.
func sandbox(sb *client.Sandbox) *client.Sandbox {
	if sb.Metadata == nil {
		sb.Metadata = map[string]string{}
	}
	return sb
}

// Inputs and outputs. The json names are the tools' argument and result names; jsonschema tags describe them.

type CreateSandboxInput struct {
	VCPU      float64           `json:"vcpu,omitempty" jsonschema:"CPUs (may be fractional, e.g. 0.5)"`
	MemMiB    int               `json:"mem_mib,omitempty" jsonschema:"memory limit in MiB"`
	TimeoutS  int               `json:"timeout_s,omitempty" jsonschema:"lifetime in seconds, after which on_timeout applies"`
	OnTimeout string            `json:"on_timeout,omitempty" jsonschema:"what happens at timeout_s: destroy or pause"`
	Env       map[string]string `json:"env,omitempty" jsonschema:"environment variables of the sandbox's processes"`
	Cwd       string            `json:"cwd,omitempty" jsonschema:"working directory of code and commands"`
	Metadata  map[string]string `json:"metadata,omitempty" jsonschema:"free key/value labels (list_sandboxes filters on them)"`
}

func (t *tools) createSandbox(ctx context.Context, _ *mcp.CallToolRequest, in CreateSandboxInput) (*mcp.CallToolResult, *client.Sandbox, error) {
	sb, err := t.c.Create(ctx, client.CreateRequest{VCPU: in.VCPU, MemMiB: in.MemMiB, TimeoutS: in.TimeoutS,
		OnTimeout: in.OnTimeout, Env: in.Env, Cwd: in.Cwd, Metadata: in.Metadata})
	if err != nil {
		return nil, nil, err
	}
	return nil, sandbox(sb), nil
}

type ListSandboxesInput struct {
	Status   string            `json:"status,omitempty" jsonschema:"only sandboxes in this status (creating, running, pausing, paused, resuming, error)"`
	Metadata map[string]string `json:"metadata,omitempty" jsonschema:"only sandboxes with all these metadata pairs"`
}

type ListSandboxesOutput struct {
	Sandboxes []client.Sandbox `json:"sandboxes"`
}

func (t *tools) listSandboxes(ctx context.Context, _ *mcp.CallToolRequest, in ListSandboxesInput) (*mcp.CallToolResult, ListSandboxesOutput, error) {
	list, err := t.c.List(ctx, client.ListOptions{Status: in.Status, Metadata: in.Metadata})
	if err != nil {
		return nil, ListSandboxesOutput{}, err
	}
	for i := range list {
		sandbox(&list[i])
	}
	return nil, ListSandboxesOutput{Sandboxes: list}, nil
}

type IDInput struct {
	ID string `json:"id" jsonschema:"the sandbox id"`
}

func (t *tools) getSandbox(ctx context.Context, _ *mcp.CallToolRequest, in IDInput) (*mcp.CallToolResult, *client.Sandbox, error) {
	sb, err := t.c.Get(ctx, in.ID)
	if err != nil {
		return nil, nil, err
	}
	return nil, sandbox(sb), nil
}

type DestroyOutput struct {
	ID        string `json:"id"`
	Destroyed bool   `json:"destroyed"`
}

func (t *tools) destroySandbox(ctx context.Context, _ *mcp.CallToolRequest, in IDInput) (*mcp.CallToolResult, DestroyOutput, error) {
	if err := t.c.Delete(ctx, in.ID); err != nil {
		return nil, DestroyOutput{}, err
	}
	return nil, DestroyOutput{ID: in.ID, Destroyed: true}, nil
}

type RunCodeInput struct {
	ID       string `json:"id" jsonschema:"the sandbox id"`
	Code     string `json:"code" jsonschema:"Python source; the value of a trailing expression is returned"`
	TimeoutS *int   `json:"timeout_s,omitempty" jsonschema:"interrupt the code after this many seconds (server default 300; 0 = no limit)"`
}

func (t *tools) runCode(ctx context.Context, _ *mcp.CallToolRequest, in RunCodeInput) (*mcp.CallToolResult, *client.Execution, error) {
	ex, err := t.c.RunCode(ctx, in.ID, client.RunCodeRequest{Code: in.Code, TimeoutS: in.TimeoutS})
	if err != nil {
		return nil, nil, err
	}
	return nil, ex, nil
}

type ExecInput struct {
	ID       string            `json:"id" jsonschema:"the sandbox id"`
	Cmd      string            `json:"cmd,omitempty" jsonschema:"a shell command, run by /bin/sh -c (set cmd or argv)"`
	Argv     []string          `json:"argv,omitempty" jsonschema:"a program and its arguments, run without a shell (set cmd or argv)"`
	Cwd      string            `json:"cwd,omitempty" jsonschema:"working directory"`
	Env      map[string]string `json:"env,omitempty" jsonschema:"extra environment variables"`
	Stdin    string            `json:"stdin,omitempty" jsonschema:"text given to the command's standard input"`
	TimeoutS *int              `json:"timeout_s,omitempty" jsonschema:"kill the command after this many seconds (server default 300; 0 = no limit)"`
}

type ExecOutput struct {
	ExitCode int    `json:"exit_code"`
	Stdout   string `json:"stdout"`
	Stderr   string `json:"stderr"`
	TimedOut bool   `json:"timed_out"`
}

func (t *tools) exec(ctx context.Context, _ *mcp.CallToolRequest, in ExecInput) (*mcp.CallToolResult, ExecOutput, error) {
	if (in.Cmd == "") == (len(in.Argv) == 0) {
		return nil, ExecOutput{}, errors.New("set exactly one of cmd and argv")
	}
	res, err := t.c.Exec(ctx, in.ID, client.ExecRequest{Cmd: in.Cmd, Argv: in.Argv, Cwd: in.Cwd, Env: in.Env, Stdin: in.Stdin, TimeoutS: in.TimeoutS})
	if err != nil {
		return nil, ExecOutput{}, err
	}
	return nil, ExecOutput{ExitCode: res.ExitCode, Stdout: res.Stdout, Stderr: res.Stderr, TimedOut: res.TimedOut}, nil
}

type PathInput struct {
	ID   string `json:"id" jsonschema:"the sandbox id"`
	Path string `json:"path" jsonschema:"absolute path, or relative to the sandbox's working directory"`
}

type ReadFileOutput struct {
	Path    string `json:"path"`
	Size    int    `json:"size"`
	Content string `json:"content"`
	Base64  bool   `json:"base64" jsonschema:"true when content is base64 (the file is not UTF-8 text)"`
}

func (t *tools) readFile(ctx context.Context, _ *mcp.CallToolRequest, in PathInput) (*mcp.CallToolResult, ReadFileOutput, error) {
	rc, err := t.c.ReadFile(ctx, in.ID, in.Path)
	if err != nil {
		return nil, ReadFileOutput{}, err
	}
	defer rc.Close()
	b, err := io.ReadAll(io.LimitReader(rc, MaxReadBytes+1))
	if err != nil {
		return nil, ReadFileOutput{}, fmt.Errorf("read %s: %w", in.Path, err)
	}
	if len(b) > MaxReadBytes {
		return nil, ReadFileOutput{}, fmt.Errorf("%s is larger than %d MiB: read parts of it with exec (head, tail, dd)", in.Path, MaxReadBytes>>20)
	}
	out := ReadFileOutput{Path: in.Path, Size: len(b)}
	if utf8.Valid(b) {
		out.Content = string(b)
	} else {
		out.Content, out.Base64 = base64.StdEncoding.EncodeToString(b), true
	}
	return nil, out, nil
}

type WriteFileInput struct {
	ID      string `json:"id" jsonschema:"the sandbox id"`
	Path    string `json:"path" jsonschema:"absolute path, or relative to the sandbox's working directory"`
	Content string `json:"content" jsonschema:"the file's content"`
	Base64  bool   `json:"base64,omitempty" jsonschema:"content is base64-encoded (for binary files)"`
}

type WriteFileOutput struct {
	Path string `json:"path"`
	Size int64  `json:"size"`
}

func (t *tools) writeFile(ctx context.Context, _ *mcp.CallToolRequest, in WriteFileInput) (*mcp.CallToolResult, WriteFileOutput, error) {
	data := []byte(in.Content)
	if in.Base64 {
		var err error
		if data, err = base64.StdEncoding.DecodeString(in.Content); err != nil {
			return nil, WriteFileOutput{}, fmt.Errorf("content is not valid base64: %w", err)
		}
	}
	n, err := t.c.WriteFile(ctx, in.ID, in.Path, bytes.NewReader(data), 0)
	if err != nil {
		return nil, WriteFileOutput{}, err
	}
	return nil, WriteFileOutput{Path: in.Path, Size: n}, nil
}

type ListFilesOutput struct {
	Path    string         `json:"path"`
	Entries []client.Entry `json:"entries"`
}

func (t *tools) listFiles(ctx context.Context, _ *mcp.CallToolRequest, in PathInput) (*mcp.CallToolResult, ListFilesOutput, error) {
	entries, err := t.c.ListFiles(ctx, in.ID, in.Path)
	if err != nil {
		return nil, ListFilesOutput{}, err
	}
	if entries == nil {
		entries = []client.Entry{}
	}
	return nil, ListFilesOutput{Path: in.Path, Entries: entries}, nil
}

type ForkInput struct {
	ID string `json:"id" jsonschema:"the sandbox to fork"`
	N  int    `json:"n,omitempty" jsonschema:"number of children, 1 to 32 (default 1)"`
}

type ForkOutput struct {
	Parent   string   `json:"parent"`
	Children []string `json:"children"`
}

func (t *tools) fork(ctx context.Context, _ *mcp.CallToolRequest, in ForkInput) (*mcp.CallToolResult, ForkOutput, error) {
	n := in.N
	if n == 0 {
		n = 1
	}
	ids, err := t.c.Fork(ctx, in.ID, n)
	if err != nil {
		return nil, ForkOutput{}, err
	}
	return nil, ForkOutput{Parent: in.ID, Children: ids}, nil
}

type MergeInput struct {
	Parent string `json:"parent" jsonschema:"the sandbox that takes over the winner's state (keeps its id)"`
	Winner string `json:"winner" jsonschema:"the sandbox whose state is kept (its id is retired)"`
}

type MergeOutput struct {
	Parent string `json:"parent"`
	Winner string `json:"winner"`
	Merged bool   `json:"merged"`
}

func (t *tools) mergeInto(ctx context.Context, _ *mcp.CallToolRequest, in MergeInput) (*mcp.CallToolResult, MergeOutput, error) {
	if err := t.c.MergeInto(ctx, in.Parent, in.Winner); err != nil {
		return nil, MergeOutput{}, err
	}
	return nil, MergeOutput{Parent: in.Parent, Winner: in.Winner, Merged: true}, nil
}

type DiffInput struct {
	A     string   `json:"a" jsonschema:"the first sandbox"`
	B     string   `json:"b" jsonschema:"the second sandbox"`
	Paths []string `json:"paths,omitempty" jsonschema:"absolute directories to compare (default /root and /tmp)"`
}

type DiffOutput struct {
	Added    []string `json:"added"`
	Removed  []string `json:"removed"`
	Modified []string `json:"modified"`
}

func (t *tools) diff(ctx context.Context, _ *mcp.CallToolRequest, in DiffInput) (*mcp.CallToolResult, DiffOutput, error) {
	d, err := t.c.Diff(ctx, in.A, in.B, in.Paths)
	if err != nil {
		return nil, DiffOutput{}, err
	}
	out := DiffOutput{Added: d.Added, Removed: d.Removed, Modified: d.Modified}
	for _, s := range []*[]string{&out.Added, &out.Removed, &out.Modified} {
		if *s == nil {
			*s = []string{}
		}
	}
	return nil, out, nil
}

type LifecycleInput struct {
	ID   string `json:"id" jsonschema:"the sandbox id"`
	Wait bool   `json:"wait,omitempty" jsonschema:"wait until the operation has finished (up to 5 minutes)"`
}

func (t *tools) pause(ctx context.Context, _ *mcp.CallToolRequest, in LifecycleInput) (*mcp.CallToolResult, *client.Sandbox, error) {
	sb, _, err := t.c.Pause(ctx, in.ID)
	return t.lifecycle(ctx, in, sb, err, client.StatusPaused)
}

func (t *tools) resume(ctx context.Context, _ *mcp.CallToolRequest, in LifecycleInput) (*mcp.CallToolResult, *client.Sandbox, error) {
	sb, _, err := t.c.Resume(ctx, in.ID)
	return t.lifecycle(ctx, in, sb, err, client.StatusRunning)
}

func (t *tools) lifecycle(ctx context.Context, in LifecycleInput, sb *client.Sandbox, err error, want string) (*mcp.CallToolResult, *client.Sandbox, error) {
	if err != nil {
		return nil, nil, err
	}
	if in.Wait && sb.Status != want {
		wctx, cancel := context.WithTimeout(ctx, maxWait)
		defer cancel()
		if sb, err = t.c.WaitStatus(wctx, in.ID, want); err != nil {
			return nil, nil, err
		}
	}
	return nil, sandbox(sb), nil
}
