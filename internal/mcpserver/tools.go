package mcpserver

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"path"
	"slices"
	"time"
	"unicode/utf8"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/ramify-dev/ramify/client"
)

// MaxReadBytes is the largest limit of one read_file call.
const MaxReadBytes = 8 << 20

// maxWait bounds the wait of pause and resume.
const maxWait = 5 * time.Minute

// tools holds the handlers and the client of the ramify server.
type tools struct {
	c *client.Client
}

// sandbox returns sb with its nil collections made empty, so that it matches the tools' output schema.
func sandbox(sb *client.Sandbox) *client.Sandbox {
	if sb.Metadata == nil {
		sb.Metadata = map[string]string{}
	}
	return sb
}

// Inputs and outputs. The json names are the tools' argument and result names; jsonschema tags describe them;
// schema.go adds enums, bounds and defaults.

type CreateSandboxInput struct {
	VCPU      float64           `json:"vcpu,omitempty" jsonschema:"CPUs, 0.1 to 64, may be fractional (server default 1)"`
	MemMiB    int               `json:"mem_mib,omitempty" jsonschema:"memory limit in MiB, 64 to 262144 (server default 1024)"`
	MaxProcs  int               `json:"max_procs,omitempty" jsonschema:"most processes at once, 16 to 65536 (server default 512)"`
	DiskMiB   int               `json:"disk_mib,omitempty" jsonschema:"disk quota of the sandbox's files in MiB (server default 10240)"`
	TimeoutS  int               `json:"timeout_s,omitempty" jsonschema:"lifetime in seconds, after which on_timeout applies (0 or omitted: none)"`
	OnTimeout string            `json:"on_timeout,omitempty" jsonschema:"what happens at timeout_s: destroy (the default) or pause"`
	Env       map[string]string `json:"env,omitempty" jsonschema:"environment variables of the sandbox's processes"`
	Cwd       string            `json:"cwd,omitempty" jsonschema:"absolute working directory of code, commands and relative file paths (default /root)"`
	Metadata  map[string]string `json:"metadata,omitempty" jsonschema:"free key/value labels (list_sandboxes filters on them)"`
	// IngressEnabled: the result's ingress.url_template is where a server started in the sandbox can be reached.
	IngressEnabled bool   `json:"ingress_enabled,omitempty" jsonschema:"make the sandbox's ports reachable over HTTP; the result's ingress.url_template (with {port} replaced) is the URL of a server started in the sandbox"`
	Template       string `json:"template,omitempty" jsonschema:"start from this template (save_template): its files and Python variables, and its settings for fields omitted here"`
	Image          string `json:"image,omitempty" jsonschema:"run on this named image (built with ramify image build --name: the default image plus extra Debian and pip packages); omitted: the default image"`
}

func (t *tools) createSandbox(ctx context.Context, _ *mcp.CallToolRequest, in CreateSandboxInput) (*mcp.CallToolResult, *client.Sandbox, error) {
	sb, err := t.c.Create(ctx, client.CreateRequest{VCPU: in.VCPU, MemMiB: in.MemMiB, MaxProcs: in.MaxProcs, DiskMiB: in.DiskMiB,
		TimeoutS: in.TimeoutS, OnTimeout: in.OnTimeout, Env: in.Env, Cwd: in.Cwd, Metadata: in.Metadata,
		IngressEnabled: in.IngressEnabled, Template: in.Template, Image: in.Image})
	if err != nil {
		return nil, nil, t.explain(err)
	}
	return nil, sandbox(sb), nil
}

type ListSandboxesInput struct {
	Status   string            `json:"status,omitempty" jsonschema:"only sandboxes in this status"`
	Metadata map[string]string `json:"metadata,omitempty" jsonschema:"only sandboxes with all these metadata pairs"`
}

type ListSandboxesOutput struct {
	Sandboxes []client.Sandbox `json:"sandboxes"`
}

func (t *tools) listSandboxes(ctx context.Context, _ *mcp.CallToolRequest, in ListSandboxesInput) (*mcp.CallToolResult, ListSandboxesOutput, error) {
	list, err := t.c.List(ctx, client.ListOptions{Status: in.Status, Metadata: in.Metadata})
	if err != nil {
		return nil, ListSandboxesOutput{}, t.explain(err)
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
		return nil, nil, t.explain(err, in.ID)
	}
	return nil, sandbox(sb), nil
}

type DestroyOutput struct {
	ID        string `json:"id"`
	Destroyed bool   `json:"destroyed"`
}

func (t *tools) destroySandbox(ctx context.Context, _ *mcp.CallToolRequest, in IDInput) (*mcp.CallToolResult, DestroyOutput, error) {
	if err := t.c.Delete(ctx, in.ID); err != nil {
		return nil, DestroyOutput{}, t.explain(err, in.ID)
	}
	return nil, DestroyOutput{ID: in.ID, Destroyed: true}, nil
}

type RunCodeInput struct {
	ID       string            `json:"id" jsonschema:"the sandbox id"`
	Code     string            `json:"code" jsonschema:"Python source; the value of a trailing expression is returned"`
	TimeoutS *int              `json:"timeout_s,omitempty" jsonschema:"interrupt the code after this many seconds (server default 300; 0 = no limit)"`
	Env      map[string]string `json:"env,omitempty" jsonschema:"environment variables set in os.environ for this call only (restored after)"`
}

// RunCodeOutput is client.Execution with the record of what was cut.
type RunCodeOutput struct {
	Stdout         string            `json:"stdout"`
	Stderr         string            `json:"stderr"`
	Value          *string           `json:"value" jsonschema:"repr() of the trailing expression, or null"`
	Error          *client.ExecError `json:"error" jsonschema:"the exception, or null"`
	ExecutionCount int               `json:"execution_count"`
	Results        []RichResult      `json:"results,omitempty" jsonschema:"the cell's rich results in order (figures, display()): images follow as image content, the others as text content"`
	Truncated      []Truncation      `json:"truncated,omitempty" jsonschema:"the outputs that were cut, and where each is saved whole"`
}

// RichResult summarises one of run_code's rich results; its content comes as the tool result's content.
type RichResult struct {
	Type    string   `json:"type" jsonschema:"execute_result (the trailing expression) or display_data (display(), plt.show(), a figure left open)"`
	Formats []string `json:"formats" jsonschema:"the result's mime types"`
	Text    string   `json:"text" jsonschema:"its text/plain form"`
}

func (t *tools) runCode(ctx context.Context, _ *mcp.CallToolRequest, in RunCodeInput) (*mcp.CallToolResult, *RunCodeOutput, error) {
	ex, err := t.c.RunCode(ctx, in.ID, client.RunCodeRequest{Code: in.Code, TimeoutS: in.TimeoutS, Env: in.Env})
	if err != nil {
		return nil, nil, t.explain(err, in.ID)
	}
	l := t.limiter(in.ID, "run_code")
	out := &RunCodeOutput{Stdout: l.limit(ctx, "stdout", ex.Stdout), Stderr: l.limit(ctx, "stderr", ex.Stderr),
		Error: ex.Error, ExecutionCount: ex.ExecutionCount}
	if ex.Value != nil {
		v := l.limit(ctx, "value", *ex.Value)
		out.Value = &v
	}
	var content []mcp.Content
	for i, r := range ex.Results {
		c, summary := resultContent(ctx, l, i, r, ex.Value, out.Value)
		out.Results = append(out.Results, summary)
		if c != nil {
			content = append(content, c)
		}
	}
	out.Truncated = l.cuts
	if len(content) == 0 {
		return nil, out, nil // the SDK sends out as JSON text
	}
	// The output as JSON text first (as the SDK does on its own), then the results: a model sees its chart.
	b, err := json.Marshal(out)
	if err != nil {
		return nil, nil, err
	}
	return &mcp.CallToolResult{Content: append([]mcp.Content{&mcp.TextContent{Text: string(b)}}, content...)}, out, nil
}

// resultContent makes one rich result MCP content: an image as image content; any other display as text (its
// markdown, else its text/plain, cut as outputs are). A trailing expression's text-only result has no content
// of its own: it is the output's value already (value, cut: its text/plain is not cut and saved a second time).
func resultContent(ctx context.Context, l *limiter, i int, r client.Result, value, cutValue *string) (mcp.Content, RichResult) {
	summary := RichResult{Type: r.Type}
	if r.Type == "execute_result" && value != nil && cutValue != nil && r.Text() == *value {
		summary.Text = *cutValue
	} else {
		summary.Text = l.limit(ctx, fmt.Sprintf("result%d", i), r.Text())
	}
	for m := range r.Data {
		summary.Formats = append(summary.Formats, m)
	}
	slices.Sort(summary.Formats)
	for _, m := range []string{"image/png", "image/jpeg"} {
		if b, err := base64.StdEncoding.DecodeString(r.Text(m)); err == nil && len(b) > 0 {
			return &mcp.ImageContent{Data: b, MIMEType: m}, summary
		}
	}
	if r.Type == "execute_result" && len(r.Data) == 1 {
		return nil, summary
	}
	text := r.Text("text/markdown")
	if text == "" {
		text = summary.Text
	}
	return &mcp.TextContent{Text: text}, summary
}

type ExecInput struct {
	ID       string            `json:"id" jsonschema:"the sandbox id"`
	Cmd      string            `json:"cmd,omitempty" jsonschema:"a shell command, run by /bin/sh -c (set cmd or argv)"`
	Argv     []string          `json:"argv,omitempty" jsonschema:"a program and its arguments, run without a shell (set cmd or argv)"`
	Cwd      string            `json:"cwd,omitempty" jsonschema:"working directory: absolute, or relative to the sandbox's cwd (default: the sandbox's cwd)"`
	Env      map[string]string `json:"env,omitempty" jsonschema:"extra environment variables"`
	Stdin    string            `json:"stdin,omitempty" jsonschema:"text given to the command's standard input"`
	TimeoutS *int              `json:"timeout_s,omitempty" jsonschema:"kill the command after this many seconds (server default 300; 0 = no limit)"`
}

type ExecOutput struct {
	ExitCode  int          `json:"exit_code"`
	Stdout    string       `json:"stdout"`
	Stderr    string       `json:"stderr"`
	TimedOut  bool         `json:"timed_out"`
	Truncated []Truncation `json:"truncated,omitempty" jsonschema:"the outputs that were cut, and where each is saved whole"`
}

func (t *tools) exec(ctx context.Context, _ *mcp.CallToolRequest, in ExecInput) (*mcp.CallToolResult, ExecOutput, error) {
	if (in.Cmd == "") == (len(in.Argv) == 0) {
		return nil, ExecOutput{}, errors.New("set exactly one of cmd and argv")
	}
	cwd := in.Cwd
	if cwd != "" {
		var err error
		if cwd, err = t.abs(ctx, in.ID, cwd); err != nil {
			return nil, ExecOutput{}, err
		}
	}
	res, err := t.c.Exec(ctx, in.ID, client.ExecRequest{Cmd: in.Cmd, Argv: in.Argv, Cwd: cwd, Env: in.Env, Stdin: in.Stdin, TimeoutS: in.TimeoutS})
	if err != nil {
		return nil, ExecOutput{}, t.explain(err, in.ID)
	}
	l := t.limiter(in.ID, "exec")
	out := ExecOutput{ExitCode: res.ExitCode, Stdout: l.limit(ctx, "stdout", res.Stdout), Stderr: l.limit(ctx, "stderr", res.Stderr), TimedOut: res.TimedOut}
	out.Truncated = l.cuts
	return nil, out, nil
}

// abs resolves p against the sandbox's cwd (where exec runs and the interpreter starts) unless it is absolute.
// The API takes absolute paths only.
func (t *tools) abs(ctx context.Context, id, p string) (string, error) {
	if path.IsAbs(p) {
		return p, nil
	}
	sb, err := t.c.Get(ctx, id)
	if err != nil {
		return "", t.explain(err, id)
	}
	if sb.Cwd == "" || !path.IsAbs(sb.Cwd) {
		return "", fmt.Errorf("path %q is relative and the server did not say sandbox %s's cwd (%q): give an absolute path", p, id, sb.Cwd)
	}
	return path.Join(sb.Cwd, p), nil
}

type ReadFileInput struct {
	ID     string `json:"id" jsonschema:"the sandbox id"`
	Path   string `json:"path" jsonschema:"absolute path, or relative to the sandbox's cwd"`
	Offset int64  `json:"offset,omitempty" jsonschema:"the first byte to return (default 0)"`
	Limit  int    `json:"limit,omitempty" jsonschema:"the most bytes to return"`
}

type ReadFileOutput struct {
	Path       string `json:"path" jsonschema:"the absolute path read"`
	Size       int64  `json:"size" jsonschema:"the file's whole size in bytes"`
	Offset     int64  `json:"offset" jsonschema:"the first byte returned"`
	Length     int    `json:"length" jsonschema:"how many bytes content holds (before base64)"`
	Content    string `json:"content"`
	Base64     bool   `json:"base64" jsonschema:"true when content is base64 (the bytes are not UTF-8 text)"`
	NextOffset *int64 `json:"next_offset,omitempty" jsonschema:"set when the file goes on after content: the offset to read next"`
}

func (t *tools) readFile(ctx context.Context, _ *mcp.CallToolRequest, in ReadFileInput) (*mcp.CallToolResult, ReadFileOutput, error) {
	p, err := t.abs(ctx, in.ID, in.Path)
	if err != nil {
		return nil, ReadFileOutput{}, err
	}
	limit := in.Limit
	if limit <= 0 || limit > MaxReadBytes {
		limit = min(max(limit, MaxTextBytes), MaxReadBytes)
	}
	st, err := t.c.Stat(ctx, in.ID, p)
	if err != nil {
		return nil, ReadFileOutput{}, t.explain(err, in.ID)
	}
	rc, err := t.c.ReadFile(ctx, in.ID, p)
	if err != nil {
		return nil, ReadFileOutput{}, t.explain(err, in.ID)
	}
	defer rc.Close()
	if _, err := io.CopyN(io.Discard, rc, in.Offset); err != nil && err != io.EOF {
		return nil, ReadFileOutput{}, fmt.Errorf("read %s: %w", p, err)
	}
	// One byte more than the limit tells whether the file goes on.
	b, err := io.ReadAll(io.LimitReader(rc, int64(limit)+1))
	if err != nil {
		return nil, ReadFileOutput{}, fmt.Errorf("read %s: %w", p, err)
	}
	more := len(b) > limit
	if more {
		b = b[:textEnd(b[:limit], b[limit:])]
	}
	out := ReadFileOutput{Path: p, Size: max(st.Size, in.Offset+int64(len(b))), Offset: in.Offset, Length: len(b)}
	if more {
		out.NextOffset = ptr(in.Offset + int64(len(b)))
	}
	if utf8.Valid(b) {
		out.Content = string(b)
	} else {
		out.Content, out.Base64 = base64.StdEncoding.EncodeToString(b), true
	}
	return nil, out, nil
}

// textEnd returns where to end a chunk b of a file that goes on with next: len(b), or up to 3 bytes less when
// that splits a UTF-8 character of otherwise valid text (the rest follows in the next chunk).
func textEnd(b, next []byte) int {
	if utf8.Valid(b) {
		return len(b)
	}
	for cut := 1; cut <= 3 && cut < len(b); cut++ {
		if utf8.Valid(b[:len(b)-cut]) && utf8.FullRune(append(b[len(b)-cut:len(b):len(b)], next...)) {
			return len(b) - cut
		}
	}
	return len(b)
}

type WriteFileInput struct {
	ID      string `json:"id" jsonschema:"the sandbox id"`
	Path    string `json:"path" jsonschema:"absolute path, or relative to the sandbox's cwd"`
	Content string `json:"content" jsonschema:"the file's content"`
	Base64  bool   `json:"base64,omitempty" jsonschema:"content is base64-encoded (for binary files)"`
}

type WriteFileOutput struct {
	Path string `json:"path" jsonschema:"the absolute path written"`
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
	p, err := t.abs(ctx, in.ID, in.Path)
	if err != nil {
		return nil, WriteFileOutput{}, err
	}
	n, err := t.c.WriteFile(ctx, in.ID, p, bytes.NewReader(data), 0)
	if err != nil {
		return nil, WriteFileOutput{}, t.explain(err, in.ID)
	}
	return nil, WriteFileOutput{Path: p, Size: n}, nil
}

type ListFilesInput struct {
	ID   string `json:"id" jsonschema:"the sandbox id"`
	Path string `json:"path,omitempty" jsonschema:"absolute path, or relative to the sandbox's cwd (default: the cwd)"`
}

type ListFilesOutput struct {
	Path    string         `json:"path" jsonschema:"the absolute path listed"`
	Entries []client.Entry `json:"entries"`
}

func (t *tools) listFiles(ctx context.Context, _ *mcp.CallToolRequest, in ListFilesInput) (*mcp.CallToolResult, ListFilesOutput, error) {
	p, err := t.abs(ctx, in.ID, in.Path)
	if err != nil {
		return nil, ListFilesOutput{}, err
	}
	entries, err := t.c.ListFiles(ctx, in.ID, p)
	if err != nil {
		return nil, ListFilesOutput{}, t.explain(err, in.ID)
	}
	if entries == nil {
		entries = []client.Entry{}
	}
	return nil, ListFilesOutput{Path: p, Entries: entries}, nil
}

type ForkInput struct {
	ID string `json:"id" jsonschema:"the sandbox to fork"`
	N  int    `json:"n,omitempty" jsonschema:"number of children, 1 to 32"`
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
		return nil, ForkOutput{}, t.explain(err, in.ID)
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
		return nil, MergeOutput{}, t.explain(err, in.Parent, in.Winner)
	}
	return nil, MergeOutput{Parent: in.Parent, Winner: in.Winner, Merged: true}, nil
}

type DiffInput struct {
	A     string   `json:"a" jsonschema:"the first sandbox"`
	B     string   `json:"b" jsonschema:"the second sandbox"`
	Paths []string `json:"paths,omitempty" jsonschema:"absolute directories to compare (default /root and /tmp)"`
}

type DiffOutput struct {
	Added     []string `json:"added"`
	Removed   []string `json:"removed"`
	Modified  []string `json:"modified"`
	Truncated bool     `json:"truncated,omitempty" jsonschema:"a list reached the server's cap of 10,000 paths: narrow paths"`
}

func (t *tools) diff(ctx context.Context, _ *mcp.CallToolRequest, in DiffInput) (*mcp.CallToolResult, DiffOutput, error) {
	d, err := t.c.Diff(ctx, in.A, in.B, in.Paths)
	if err != nil {
		return nil, DiffOutput{}, t.explain(err, in.A, in.B)
	}
	out := DiffOutput{Added: d.Added, Removed: d.Removed, Modified: d.Modified, Truncated: d.Truncated}
	for _, s := range []*[]string{&out.Added, &out.Removed, &out.Modified} {
		if *s == nil {
			*s = []string{}
		}
	}
	return nil, out, nil
}

type LifecycleInput struct {
	ID   string `json:"id" jsonschema:"the sandbox id"`
	Wait *bool  `json:"wait,omitempty"`
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
		return nil, nil, t.explain(err, in.ID)
	}
	if (in.Wait == nil || *in.Wait) && sb.Status != want {
		wctx, cancel := context.WithTimeout(ctx, maxWait)
		defer cancel()
		if sb, err = t.c.WaitStatus(wctx, in.ID, want); err != nil {
			return nil, nil, t.explain(err, in.ID)
		}
	}
	return nil, sandbox(sb), nil
}

type SetTimeoutInput struct {
	ID       string `json:"id" jsonschema:"the sandbox id"`
	TimeoutS int    `json:"timeout_s" jsonschema:"seconds from now after which the sandbox times out (its on_timeout action); 0 = never"`
}

func (t *tools) setTimeout(ctx context.Context, _ *mcp.CallToolRequest, in SetTimeoutInput) (*mcp.CallToolResult, *client.Sandbox, error) {
	sb, err := t.c.SetTimeout(ctx, in.ID, in.TimeoutS)
	if err != nil {
		return nil, nil, t.explain(err, in.ID)
	}
	return nil, sandbox(sb), nil
}

type InterruptInput struct {
	ID   string `json:"id" jsonschema:"the sandbox id"`
	What string `json:"what,omitempty" jsonschema:"stop only run_code calls or only exec calls (default: both)"`
}

type InterruptOutput struct {
	RunCode int `json:"run_code" jsonschema:"run_code calls stopped"`
	Exec    int `json:"exec" jsonschema:"exec calls stopped"`
}

func (t *tools) interrupt(ctx context.Context, _ *mcp.CallToolRequest, in InterruptInput) (*mcp.CallToolResult, InterruptOutput, error) {
	n, err := t.c.Interrupt(ctx, in.ID, in.What)
	if err != nil {
		return nil, InterruptOutput{}, t.explain(err, in.ID)
	}
	return nil, InterruptOutput{RunCode: n.RunCode, Exec: n.Exec}, nil
}

type SaveTemplateInput struct {
	ID   string `json:"id" jsonschema:"the running sandbox to capture"`
	Name string `json:"name" jsonschema:"the template's name: 1 to 63 characters of a-z, 0-9, '-', '_' and '.', starting with a letter or digit"`
}

func (t *tools) saveTemplate(ctx context.Context, _ *mcp.CallToolRequest, in SaveTemplateInput) (*mcp.CallToolResult, *client.Template, error) {
	tp, err := t.c.SaveTemplate(ctx, in.Name, in.ID)
	if err != nil {
		return nil, nil, t.explain(err, in.ID)
	}
	return nil, template(tp), nil
}

// template returns tp with its nil collections made empty, so that it matches the tools' output schema.
func template(tp *client.Template) *client.Template {
	if tp.NotSaved == nil {
		tp.NotSaved = []client.Skipped{}
	}
	return tp
}

type ListTemplatesOutput struct {
	Templates []client.Template `json:"templates"`
}

func (t *tools) listTemplates(ctx context.Context, _ *mcp.CallToolRequest, _ struct{}) (*mcp.CallToolResult, ListTemplatesOutput, error) {
	ts, err := t.c.Templates(ctx)
	if err != nil {
		return nil, ListTemplatesOutput{}, t.explain(err)
	}
	out := ListTemplatesOutput{Templates: []client.Template{}}
	for i := range ts {
		out.Templates = append(out.Templates, *template(&ts[i]))
	}
	return nil, out, nil
}

type DeleteTemplateInput struct {
	Name string `json:"name" jsonschema:"the template to delete"`
}

type DeleteTemplateOutput struct {
	Deleted string `json:"deleted"`
}

func (t *tools) deleteTemplate(ctx context.Context, _ *mcp.CallToolRequest, in DeleteTemplateInput) (*mcp.CallToolResult, DeleteTemplateOutput, error) {
	if err := t.c.DeleteTemplate(ctx, in.Name); err != nil {
		return nil, DeleteTemplateOutput{}, t.explain(err)
	}
	return nil, DeleteTemplateOutput{Deleted: in.Name}, nil
}
