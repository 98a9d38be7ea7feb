package mcpserver_test

import (
	"bytes"
	"context"
	"encoding/base64"
	"encoding/json"
	"os"
	"os/exec"
	"reflect"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"github.com/modelcontextprotocol/go-sdk/mcp"

	"github.com/ramify-dev/ramify/client"
	"github.com/ramify-dev/ramify/internal/mcpserver"
	"github.com/ramify-dev/ramify/internal/testserver"
)

var allTools = []string{"create_sandbox", "list_sandboxes", "get_sandbox", "destroy_sandbox", "run_code", "exec",
	"read_file", "write_file", "list_files", "fork", "merge_into", "diff", "pause", "resume", "set_timeout", "interrupt",
	"save_template", "list_templates", "delete_template"}

// session is an MCP client session with `ramify mcp` run as a subprocess against a real server.
type session struct {
	t  *testing.T
	cs *mcp.ClientSession
}

// call calls a tool that must succeed and decodes its structured result into out (if non-nil).
func (s *session) call(ctx context.Context, name string, args map[string]any, out any) {
	s.t.Helper()
	res, err := s.cs.CallTool(ctx, &mcp.CallToolParams{Name: name, Arguments: args})
	if err != nil {
		s.t.Fatalf("%s(%v): protocol error: %v", name, args, err)
	}
	if res.IsError {
		s.t.Fatalf("%s(%v): tool error: %s", name, args, text(res))
	}
	if out == nil {
		return
	}
	b, err := json.Marshal(res.StructuredContent)
	if err != nil {
		s.t.Fatal(err)
	}
	if err := json.Unmarshal(b, out); err != nil {
		s.t.Fatalf("%s: decode %s: %v", name, b, err)
	}
	// The (first) text content carries the same JSON, for clients that ignore structured content.
	if tc, ok := res.Content[0].(*mcp.TextContent); !ok || !json.Valid([]byte(tc.Text)) {
		s.t.Errorf("%s: first content is not JSON text: %#v", name, res.Content[0])
	}
}

// callErr calls a tool that must fail with a tool error (not a protocol error) and returns its message.
func (s *session) callErr(ctx context.Context, name string, args map[string]any) string {
	s.t.Helper()
	res, err := s.cs.CallTool(ctx, &mcp.CallToolParams{Name: name, Arguments: args})
	if err != nil {
		s.t.Fatalf("%s(%v): want a tool error, got a protocol error: %v", name, args, err)
	}
	if !res.IsError {
		s.t.Fatalf("%s(%v): want a tool error, got success: %s", name, args, text(res))
	}
	return text(res)
}

func text(res *mcp.CallToolResult) string {
	var sb strings.Builder
	for _, c := range res.Content {
		if tc, ok := c.(*mcp.TextContent); ok {
			sb.WriteString(tc.Text)
		}
	}
	return sb.String()
}

func TestMCPSession(t *testing.T) {
	srv := testserver.Start(t)
	bin := testserver.Binary(t)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	cmd := exec.Command(bin, "mcp")
	cmd.Env = append(os.Environ(), "RAMIFY_API_URL="+srv.URL, "RAMIFY_API_KEY="+srv.Key)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	c := mcp.NewClient(&mcp.Implementation{Name: "ramify-test", Version: "0"}, nil)
	cs, err := c.Connect(ctx, &mcp.CommandTransport{Command: cmd}, nil)
	if err != nil {
		t.Fatalf("connect to 'ramify mcp': %v\nstderr: %s", err, stderr.String())
	}
	defer func() {
		if err := cs.Close(); err != nil {
			t.Logf("close: %v", err)
		}
		if t.Failed() {
			t.Logf("ramify mcp stderr:\n%s", stderr.String())
		}
	}()
	s := &session{t: t, cs: cs}

	// Initialize (done by Connect) and list the tools.
	if ir := cs.InitializeResult(); ir == nil || ir.ServerInfo == nil || ir.ServerInfo.Name != "ramify" {
		t.Fatalf("initialize result: %+v", ir)
	}
	lt, err := cs.ListTools(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, tool := range lt.Tools {
		names = append(names, tool.Name)
		if tool.Description == "" || tool.InputSchema == nil {
			t.Errorf("tool %s: no description or input schema", tool.Name)
		}
	}
	sort.Strings(names)
	want := slices.Clone(allTools)
	sort.Strings(want)
	if !slices.Equal(names, want) {
		t.Fatalf("tools = %v, want %v", names, want)
	}

	// Create.
	var sb client.Sandbox
	s.call(ctx, "create_sandbox", map[string]any{"metadata": map[string]string{"suite": "mcp"}, "env": map[string]string{"GREETING": "hi"}}, &sb)
	if sb.ID == "" || sb.Status != client.StatusRunning || sb.Metadata["suite"] != "mcp" {
		t.Fatalf("create_sandbox = %+v", sb)
	}
	id := sb.ID
	t.Logf("sandbox %s", id)
	var ing client.Sandbox
	s.call(ctx, "create_sandbox", map[string]any{"ingress_enabled": true}, &ing)
	if !ing.Ingress.Enabled || ing.Ingress.PathTemplate == "" || sb.Ingress.Enabled {
		t.Fatalf("create_sandbox with ingress_enabled: %+v (without: %+v)", ing.Ingress, sb.Ingress)
	}
	s.call(ctx, "destroy_sandbox", map[string]any{"id": ing.ID}, nil)

	// run_code twice: the interpreter persists.
	var ex client.Execution
	s.call(ctx, "run_code", map[string]any{"id": id, "code": "x = 21\nprint('set')"}, &ex)
	if ex.Stdout != "set\n" || ex.Error != nil {
		t.Fatalf("run_code 1 = %+v", ex)
	}
	ex = client.Execution{}
	s.call(ctx, "run_code", map[string]any{"id": id, "code": "x * 2", "timeout_s": 30}, &ex)
	if ex.Value == nil || *ex.Value != "42" {
		t.Fatalf("run_code 2 = %+v, want value 42", ex)
	}
	// A Python exception is a result, not a tool error.
	ex = client.Execution{}
	s.call(ctx, "run_code", map[string]any{"id": id, "code": "1/0"}, &ex)
	if ex.Error == nil || ex.Error.Name != "ZeroDivisionError" {
		t.Fatalf("run_code 1/0 = %+v", ex)
	}

	// Rich results: a figure as image content, a Markdown display as text, after the output's JSON.
	res, err := s.cs.CallTool(ctx, &mcp.CallToolParams{Name: "run_code", Arguments: map[string]any{"id": id,
		"code": "import matplotlib.pyplot as plt\nplt.plot([1, 2])\nplt.show()\nfrom IPython.display import Markdown\n" +
			"display(Markdown('**done**'))\n'value'"}})
	if err != nil || res.IsError || len(res.Content) != 3 {
		t.Fatalf("run_code with a figure: %v %+v", err, res)
	}
	if img, ok := res.Content[1].(*mcp.ImageContent); !ok || img.MIMEType != "image/png" || !bytes.HasPrefix(img.Data, []byte("\x89PNG")) {
		t.Errorf("second content %#v, want a PNG image", res.Content[1])
	}
	if tc, ok := res.Content[2].(*mcp.TextContent); !ok || tc.Text != "**done**" {
		t.Errorf("third content %#v, want the markdown", res.Content[2])
	}
	var rich mcpserver.RunCodeOutput
	b, _ := json.Marshal(res.StructuredContent)
	if err := json.Unmarshal(b, &rich); err != nil || len(rich.Results) != 3 || rich.Results[2].Type != "execute_result" ||
		!slices.Contains(rich.Results[0].Formats, "image/png") || rich.Value == nil || *rich.Value != "'value'" {
		t.Errorf("structured output %s", b)
	}

	// exec: cmd (with the sandbox's env) and argv.
	var er struct {
		ExitCode int    `json:"exit_code"`
		Stdout   string `json:"stdout"`
		Stderr   string `json:"stderr"`
	}
	s.call(ctx, "exec", map[string]any{"id": id, "cmd": "echo $GREETING $EXTRA; echo oops >&2; exit 3", "env": map[string]string{"EXTRA": "there"}}, &er)
	if er.ExitCode != 3 || er.Stdout != "hi there\n" || er.Stderr != "oops\n" {
		t.Fatalf("exec cmd = %+v", er)
	}
	er.Stdout = ""
	s.call(ctx, "exec", map[string]any{"id": id, "argv": []string{"pwd"}, "cwd": "/tmp"}, &er)
	if er.ExitCode != 0 || er.Stdout != "/tmp\n" {
		t.Fatalf("exec argv = %+v", er)
	}
	if msg := s.callErr(ctx, "exec", map[string]any{"id": id}); !strings.Contains(msg, "cmd") {
		t.Errorf("exec without cmd or argv: %q", msg)
	}

	// write_file / read_file, text and binary; list_files.
	var wf struct {
		Size int64 `json:"size"`
	}
	s.call(ctx, "write_file", map[string]any{"id": id, "path": "/root/notes/hello.txt", "content": "hello, mcp\n"}, &wf)
	if wf.Size != 11 {
		t.Errorf("write_file size = %d", wf.Size)
	}
	var rf struct {
		Content string `json:"content"`
		Base64  bool   `json:"base64"`
		Size    int    `json:"size"`
	}
	s.call(ctx, "read_file", map[string]any{"id": id, "path": "notes/hello.txt"}, &rf)
	if rf.Content != "hello, mcp\n" || rf.Base64 {
		t.Fatalf("read_file text = %+v", rf)
	}
	bin3 := []byte{0, 0xff, 0xfe, 1, 2}
	s.call(ctx, "write_file", map[string]any{"id": id, "path": "/root/notes/blob.bin", "content": base64.StdEncoding.EncodeToString(bin3), "base64": true}, nil)
	rf = struct {
		Content string `json:"content"`
		Base64  bool   `json:"base64"`
		Size    int    `json:"size"`
	}{}
	s.call(ctx, "read_file", map[string]any{"id": id, "path": "/root/notes/blob.bin"}, &rf)
	if got, _ := base64.StdEncoding.DecodeString(rf.Content); !rf.Base64 || !bytes.Equal(got, bin3) || rf.Size != len(bin3) {
		t.Fatalf("read_file binary = %+v", rf)
	}
	// The interpreter sees the file written through the tools.
	ex = client.Execution{}
	s.call(ctx, "run_code", map[string]any{"id": id, "code": "open('/root/notes/hello.txt').read()"}, &ex)
	if ex.Value == nil || *ex.Value != `'hello, mcp\n'` {
		t.Fatalf("run_code read = %+v", ex)
	}
	var lf struct {
		Entries []client.Entry `json:"entries"`
	}
	s.call(ctx, "list_files", map[string]any{"id": id, "path": "notes"}, &lf) // relative to the cwd, /root
	var files []string
	for _, e := range lf.Entries {
		files = append(files, e.Name)
	}
	if !slices.Equal(files, []string{"blob.bin", "hello.txt"}) {
		t.Fatalf("list_files = %v", files)
	}
	if msg := s.callErr(ctx, "read_file", map[string]any{"id": id, "path": "/root/nope.txt"}); msg == "" {
		t.Error("read_file of a missing file: empty error")
	}

	// fork n=2, change the children differently, diff them, merge one into the parent.
	var fk struct {
		Children []string `json:"children"`
	}
	s.call(ctx, "fork", map[string]any{"id": id, "n": 2}, &fk)
	if len(fk.Children) != 2 {
		t.Fatalf("fork = %+v", fk)
	}
	c1, c2 := fk.Children[0], fk.Children[1]
	s.call(ctx, "run_code", map[string]any{"id": c1, "code": "x = 1\nopen('/root/one.txt', 'w').write('1')"}, nil)
	s.call(ctx, "run_code", map[string]any{"id": c2, "code": "x = 2\nopen('/root/two.txt', 'w').write('2')"}, nil)
	s.call(ctx, "write_file", map[string]any{"id": c2, "path": "/root/notes/hello.txt", "content": "changed\n"}, nil)
	var df client.Diff
	s.call(ctx, "diff", map[string]any{"a": c1, "b": c2, "paths": []string{"/root"}}, &df)
	if !slices.Contains(df.Added, "/root/two.txt") || !slices.Contains(df.Removed, "/root/one.txt") || !slices.Contains(df.Modified, "/root/notes/hello.txt") {
		t.Fatalf("diff = %+v", df)
	}
	var mg struct {
		Merged bool `json:"merged"`
	}
	s.call(ctx, "merge_into", map[string]any{"parent": id, "winner": c2}, &mg)
	if !mg.Merged {
		t.Fatalf("merge_into = %+v", mg)
	}
	ex = client.Execution{}
	s.call(ctx, "run_code", map[string]any{"id": id, "code": "(x, open('/root/two.txt').read())"}, &ex)
	if ex.Value == nil || *ex.Value != "(2, '2')" {
		t.Fatalf("parent after merge = %+v", ex)
	}
	if msg := s.callErr(ctx, "get_sandbox", map[string]any{"id": c2}); !strings.Contains(msg, "was merged into "+id) {
		t.Errorf("get_sandbox of the merged winner: %q, want it to say it was merged into %s", msg, id)
	}
	s.call(ctx, "destroy_sandbox", map[string]any{"id": c1}, nil)

	// save_template, a sandbox from it with the interpreter's state, list_templates, delete_template.
	var tp client.Template
	s.call(ctx, "save_template", map[string]any{"id": id, "name": "mcp-tpl"}, &tp)
	if tp.Name != "mcp-tpl" || tp.From != id || tp.Size <= 0 {
		t.Fatalf("save_template = %+v", tp)
	}
	var fromTpl client.Sandbox
	s.call(ctx, "create_sandbox", map[string]any{"template": "mcp-tpl"}, &fromTpl)
	if fromTpl.Template != "mcp-tpl" || fromTpl.ID == id {
		t.Fatalf("create_sandbox from a template = %+v", fromTpl)
	}
	var srcEx, fromEx client.Execution
	s.call(ctx, "run_code", map[string]any{"id": id, "code": "repr(x)"}, &srcEx)
	s.call(ctx, "run_code", map[string]any{"id": fromTpl.ID, "code": "repr(x)"}, &fromEx)
	if srcEx.Value == nil || fromEx.Value == nil || *fromEx.Value != *srcEx.Value {
		t.Fatalf("x in the sandbox from the template = %+v, in its source %+v", fromEx, srcEx)
	}
	var tl struct{ Templates []client.Template }
	s.call(ctx, "list_templates", map[string]any{}, &tl)
	if len(tl.Templates) != 1 || tl.Templates[0].Name != "mcp-tpl" {
		t.Fatalf("list_templates = %+v", tl)
	}
	s.call(ctx, "delete_template", map[string]any{"name": "mcp-tpl"}, nil)
	if msg := s.callErr(ctx, "delete_template", map[string]any{"name": "mcp-tpl"}); !strings.Contains(msg, "not found") {
		t.Errorf("second delete_template: %q", msg)
	}
	s.call(ctx, "destroy_sandbox", map[string]any{"id": fromTpl.ID}, nil)

	// pause and resume, waiting; the interpreter's state survives.
	sb = client.Sandbox{}
	s.call(ctx, "pause", map[string]any{"id": id}, &sb) // waits by default
	if sb.Status != client.StatusPaused {
		t.Fatalf("pause = %+v", sb)
	}
	sb = client.Sandbox{}
	s.call(ctx, "get_sandbox", map[string]any{"id": id}, &sb)
	if sb.Status != client.StatusPaused {
		t.Fatalf("get_sandbox after pause = %+v", sb)
	}
	sb = client.Sandbox{}
	s.call(ctx, "resume", map[string]any{"id": id}, &sb)
	if sb.Status != client.StatusRunning {
		t.Fatalf("resume = %+v", sb)
	}
	ex = client.Execution{}
	s.call(ctx, "run_code", map[string]any{"id": id, "code": "x"}, &ex)
	if ex.Value == nil || *ex.Value != "2" {
		t.Fatalf("run_code after resume = %+v", ex)
	}

	// list_sandboxes sees the sandbox (and not the retired or destroyed ones).
	var ls struct {
		Sandboxes []client.Sandbox `json:"sandboxes"`
	}
	s.call(ctx, "list_sandboxes", map[string]any{"metadata": map[string]string{"suite": "mcp"}}, &ls)
	var ids []string
	for _, x := range ls.Sandboxes {
		ids = append(ids, x.ID)
	}
	if !slices.Contains(ids, id) || slices.Contains(ids, c1) || slices.Contains(ids, c2) {
		t.Fatalf("list_sandboxes = %v (want %s, not %s or %s)", ids, id, c1, c2)
	}

	// destroy.
	s.call(ctx, "destroy_sandbox", map[string]any{"id": id}, nil)
	if msg := s.callErr(ctx, "get_sandbox", map[string]any{"id": id}); !strings.Contains(msg, "was deleted at") {
		t.Errorf("get_sandbox after destroy: %q", msg)
	}

	// Errors of the API are tool errors carrying the server's message.
	if msg := s.callErr(ctx, "run_code", map[string]any{"id": "sb-does-not-exist", "code": "1"}); !strings.Contains(msg, "sandbox not found") {
		t.Errorf("run_code on an unknown id: %q, want it to contain %q", msg, "sandbox not found")
	}
	// A missing required argument is a tool error too.
	if msg := s.callErr(ctx, "run_code", map[string]any{"code": "1"}); !strings.Contains(msg, "id") {
		t.Errorf("run_code without id: %q", msg)
	}
}

// TestNewInMemory checks the server built by New without a ramify server: the tools' schemas and annotations,
// and the error of an unreachable API, through in-memory transports.
func TestNewInMemory(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// A port nothing listens on: every API call fails.
	srv := mcpserver.New(client.New("http://127.0.0.1:1", "k"), "test")
	st, ct := mcp.NewInMemoryTransports()
	ss, err := srv.Connect(ctx, st, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer ss.Close()
	cs, err := mcp.NewClient(&mcp.Implementation{Name: "t"}, nil).Connect(ctx, ct, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer cs.Close()
	lt, err := cs.ListTools(ctx, nil)
	if err != nil {
		t.Fatal(err)
	}
	tools := map[string]*mcp.Tool{}
	for _, tool := range lt.Tools {
		tools[tool.Name] = tool
	}
	if len(tools) != len(allTools) {
		t.Errorf("%d tools, want %d", len(lt.Tools), len(allTools))
	}
	checkAnnotations(t, tools)
	checkSchemas(t, tools)
	for name, tool := range tools {
		for _, s := range []any{tool.InputSchema, tool.OutputSchema} {
			b, _ := json.Marshal(s)
			if bytes.Contains(b, []byte(`"type":[`)) {
				t.Errorf("%s: a type array (nullable) in %s: not every client reads those", name, b)
			}
		}
	}

	res, err := cs.CallTool(ctx, &mcp.CallToolParams{Name: "get_sandbox", Arguments: map[string]any{"id": "x"}})
	if err != nil {
		t.Fatalf("protocol error: %v", err)
	}
	msg := text(res)
	for _, want := range []string{"cannot reach the ramify server at http://127.0.0.1:1", "connection refused", "ramify serve", "make run", "RAMIFY_API_URL"} {
		if !res.IsError || !strings.Contains(msg, want) {
			t.Errorf("get_sandbox with no server: IsError=%v %q, want it to contain %q", res.IsError, msg, want)
		}
	}
	// Arguments out of the schema's bounds are refused before any call.
	res, err = cs.CallTool(ctx, &mcp.CallToolParams{Name: "fork", Arguments: map[string]any{"id": "x", "n": 33}})
	if err != nil || !res.IsError || !strings.Contains(text(res), "maximum") {
		t.Errorf("fork n=33: err=%v IsError=%v %q", err, res != nil && res.IsError, text(res))
	}
}

// checkAnnotations checks every tool's hints: the read-only tools say so, the others say whether they destroy.
func checkAnnotations(t *testing.T, tools map[string]*mcp.Tool) {
	t.Helper()
	type hints struct{ readOnly, destructive, idempotent, openWorld bool }
	want := map[string]hints{
		"list_sandboxes": {readOnly: true, idempotent: true}, "get_sandbox": {readOnly: true, idempotent: true},
		"read_file": {readOnly: true, idempotent: true}, "list_files": {readOnly: true, idempotent: true},
		"diff":           {readOnly: true, idempotent: true},
		"create_sandbox": {}, "fork": {}, "resume": {idempotent: true},
		"destroy_sandbox": {destructive: true, idempotent: true}, "write_file": {destructive: true, idempotent: true},
		"pause":      {destructive: true, idempotent: true},
		"merge_into": {destructive: true},
		"run_code":   {destructive: true, openWorld: true}, "exec": {destructive: true, openWorld: true},
		"set_timeout": {idempotent: true}, "interrupt": {destructive: true, idempotent: true},
		"save_template": {}, "list_templates": {readOnly: true, idempotent: true}, "delete_template": {destructive: true},
	}
	if len(tools) != len(want) {
		t.Errorf("%d tools, %d with expected hints: a tool was added without them", len(tools), len(want))
	}
	for name, w := range want {
		a := tools[name].Annotations
		if a == nil || a.DestructiveHint == nil && !a.ReadOnlyHint || a.OpenWorldHint == nil || a.Title == "" {
			t.Errorf("%s: incomplete annotations %+v", name, a)
			continue
		}
		got := hints{a.ReadOnlyHint, a.DestructiveHint != nil && *a.DestructiveHint, a.IdempotentHint, *a.OpenWorldHint}
		if got != w {
			t.Errorf("%s: hints %+v, want %+v", name, got, w)
		}
	}
}

// checkSchemas checks the enums, bounds and defaults of the input schemas.
func checkSchemas(t *testing.T, tools map[string]*mcp.Tool) {
	t.Helper()
	prop := func(tool, name string) map[string]any {
		b, _ := json.Marshal(tools[tool].InputSchema)
		var s struct {
			Properties map[string]map[string]any `json:"properties"`
		}
		if err := json.Unmarshal(b, &s); err != nil || s.Properties[name] == nil {
			t.Fatalf("%s: no property %s in %s", tool, name, b)
		}
		return s.Properties[name]
	}
	for _, c := range []struct {
		tool, prop, key string
		want            any
	}{
		{"create_sandbox", "on_timeout", "enum", []any{"destroy", "pause"}},
		{"list_sandboxes", "status", "enum", []any{"creating", "running", "pausing", "paused", "resuming", "error"}},
		{"fork", "n", "minimum", 1.0}, {"fork", "n", "maximum", 32.0}, {"fork", "n", "default", 1.0},
		{"run_code", "timeout_s", "minimum", 0.0}, {"run_code", "timeout_s", "maximum", 86400.0},
		{"exec", "timeout_s", "maximum", 86400.0}, {"create_sandbox", "timeout_s", "maximum", 2592000.0},
		{"pause", "wait", "default", true}, {"resume", "wait", "default", true},
		{"read_file", "limit", "default", float64(mcpserver.MaxTextBytes)},
	} {
		if got := prop(c.tool, c.prop)[c.key]; !reflect.DeepEqual(got, c.want) {
			t.Errorf("%s.%s.%s = %v, want %v", c.tool, c.prop, c.key, got, c.want)
		}
	}
}
