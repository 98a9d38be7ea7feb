package api

// The contract test: a real server (bin/ramify, real sandboxes) driven through every operation of openapi.json,
// success and the main errors, with every request and response checked against the document by a third-party
// validator (kin-openapi's openapi3filter, JSON Schema 2020-12). The document is closed for the check (an object
// schema without additionalProperties gets additionalProperties: false), so a field, a status or a content type the
// handlers return and the document does not declare fails the test; so does an operation the test did not drive.

import (
	"archive/tar"
	"bufio"
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
	"github.com/getkin/kin-openapi/openapi3filter"
	"github.com/getkin/kin-openapi/routers"
	"github.com/getkin/kin-openapi/routers/legacy"
	"golang.org/x/crypto/ssh"

	"github.com/ramify-dev/ramify/client"
	"github.com/ramify-dev/ramify/internal/testserver"
)

// contract drives one server and checks each exchange against the document.
type contract struct {
	t       *testing.T
	srv     *testserver.Server
	doc     *openapi3.T
	router  routers.Router
	covered map[string]map[int]bool // operationId -> statuses seen
}

// exchange is one request and what the server must answer.
type exchange struct {
	method, path string // path with its query
	body         []byte
	contentType  string            // default application/json when body is set
	header       map[string]string // extra request headers
	noAuth       bool
	status       int
	// invalid: the document itself says the request is wrong (the validator must refuse it, as the server does).
	invalid bool
	// until: the response is a stream that does not end (server-sent events): read it up to this text, then
	// validate what was read.
	until string
}

func init() {
	openapi3filter.RegisterBodyDecoder("text/event-stream", decodeSSE)
}

// decodeSSE reads a server-sent event stream (as much of it as was read) and checks the data of every event
// against the document's schema for it; it answers the last event's data.
func decodeSSE(body io.Reader, _ http.Header, schema *openapi3.SchemaRef, _ openapi3filter.EncodingFn) (any, error) {
	b, err := io.ReadAll(body)
	if err != nil {
		return nil, err
	}
	var last any
	n := 0
	for _, block := range strings.Split(string(b), "\n\n") {
		for _, line := range strings.Split(block, "\n") {
			data, ok := strings.CutPrefix(line, "data: ")
			if !ok {
				continue
			}
			var ev any
			if err := json.Unmarshal([]byte(data), &ev); err != nil {
				return nil, fmt.Errorf("event data %q is not JSON: %v", data, err)
			}
			if err := schema.Value.VisitJSON(ev, openapi3.EnableJSONSchema2020()); err != nil {
				return nil, fmt.Errorf("event %s: %v", data, err)
			}
			last, n = ev, n+1
		}
	}
	if n == 0 {
		return nil, fmt.Errorf("no event in %.300q", b)
	}
	return last, nil
}

func TestContractEveryOperation(t *testing.T) {
	// A fresh images directory over the shared default image: the images the test builds go there.
	srv := testserver.Start(t, "--image-dir", testserver.ImageDir(t), "--ssh-listen", "127.0.0.1:0")
	c := newContract(t, srv)
	c.health()
	ids := c.sandboxes()
	c.runningCode(ids.a)
	c.files(ids.a)
	c.forkMergeDiff(ids.a)
	c.pauseResume(ids.a)
	c.templates(ids.a)
	c.images()
	c.observe(ids.a)
	c.ingress(ids.a)
	c.deleteSandbox(ids.a)
	c.methodsAndRoutes()
	c.everyOperationCovered()
}

func newContract(t *testing.T, srv *testserver.Server) *contract {
	ctx := context.Background()
	// The served document is the embedded one (else bin/ramify is older than the source).
	served := get(t, srv.URL+"/v1/openapi.json")
	if !bytes.Equal(served, openAPIDoc) {
		t.Fatal("the server's /v1/openapi.json differs from internal/api/openapi.json: rebuild bin/ramify (make build)")
	}
	plain, err := openapi3.NewLoader().LoadFromData(openAPIDoc)
	if err != nil {
		t.Fatalf("openapi.json does not load: %v", err)
	}
	if err := plain.Validate(ctx); err != nil {
		t.Fatalf("openapi.json is not a valid OpenAPI document: %v", err)
	}
	closedDoc, err := closeSchemas(openAPIDoc)
	if err != nil {
		t.Fatal(err)
	}
	doc, err := openapi3.NewLoader().LoadFromData(closedDoc)
	if err != nil {
		t.Fatalf("the closed document does not load: %v", err)
	}
	doc.Servers = openapi3.Servers{{URL: srv.URL}}
	router, err := legacy.NewRouter(doc)
	if err != nil {
		t.Fatal(err)
	}
	openapi3filter.RegisterBodyDecoder("application/x-tar", openapi3filter.FileBodyDecoder)
	openapi3filter.RegisterBodyDecoder("application/x-ndjson", ndjsonDecoder)
	openapi3filter.RegisterBodyDecoder("text/html", openapi3filter.FileBodyDecoder) // an app's page, via the ports route
	return &contract{t: t, srv: srv, doc: doc, router: router, covered: map[string]map[int]bool{}}
}

// closeSchemas returns the document with every object schema that lists properties and says nothing about others
// closed (additionalProperties: false). An allOf composition is closed as a whole (unevaluatedProperties: false)
// over open copies of its parts, which are closed where they are used on their own.
func closeSchemas(doc []byte) ([]byte, error) {
	var d map[string]any
	if err := json.Unmarshal(doc, &d); err != nil {
		return nil, err
	}
	var open map[string]any // components.schemas before closing, for the parts of allOf
	schemas := d["components"].(map[string]any)["schemas"].(map[string]any)
	b, _ := json.Marshal(schemas)
	json.Unmarshal(b, &open) //nolint:errcheck // just marshalled
	var walk func(v any)
	walk = func(v any) {
		switch x := v.(type) {
		case map[string]any:
			if parts, ok := x["allOf"].([]any); ok {
				for i, p := range parts {
					if ref, ok := p.(map[string]any)["$ref"].(string); ok {
						parts[i] = open[strings.TrimPrefix(ref, "#/components/schemas/")]
					}
				}
				x["unevaluatedProperties"] = false
				return
			}
			if _, ok := x["properties"].(map[string]any); ok && x["type"] == "object" {
				if _, set := x["additionalProperties"]; !set {
					x["additionalProperties"] = false
				}
			}
			for k, e := range x {
				if k != "example" && k != "examples" {
					walk(e)
				}
			}
		case []any:
			for _, e := range x {
				walk(e)
			}
		}
	}
	walk(d)
	return json.Marshal(d)
}

// ndjsonDecoder checks every line of an NDJSON stream against the media type's schema (one event) and gives the
// last event to the validator, which checks it once more.
func ndjsonDecoder(body io.Reader, _ http.Header, schema *openapi3.SchemaRef, _ openapi3filter.EncodingFn) (any, error) {
	var last any
	sc := bufio.NewScanner(body)
	sc.Buffer(nil, 64<<20)
	n := 0
	for sc.Scan() {
		n++
		var ev any
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			return nil, fmt.Errorf("line %d is not JSON: %v", n, err)
		}
		if err := schema.Value.VisitJSON(ev, openapi3.EnableJSONSchema2020()); err != nil {
			return nil, fmt.Errorf("line %d %s: %v", n, sc.Bytes(), err)
		}
		last = ev
	}
	if n == 0 {
		return nil, fmt.Errorf("empty stream")
	}
	return last, sc.Err()
}

// readUntil reads r until what it read contains want and ends at the end of an event (a blank line), so that no
// event is cut in the middle (at most 1 MiB).
func readUntil(r io.Reader, want string) ([]byte, error) {
	var got []byte
	buf := make([]byte, 4096)
	for !bytes.Contains(got, []byte(want)) || !bytes.HasSuffix(got, []byte("\n\n")) {
		n, err := r.Read(buf)
		got = append(got, buf[:n]...)
		if err != nil || len(got) > 1<<20 {
			return got, fmt.Errorf("the stream ended (%v) before %q: %.300s", err, want, got)
		}
	}
	return got, nil
}

func get(t *testing.T, url string) []byte {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return b
}

// do sends x, checks that the request and the response are what the document says, and returns the response.
func (c *contract) do(x exchange) (http.Header, []byte) {
	c.t.Helper()
	return c.doWhile(x, nil)
}

// doWhile is do; with during set, it reads the response up to its first line, calls during, then reads the rest.
func (c *contract) doWhile(x exchange, during func()) (http.Header, []byte) {
	t := c.t
	t.Helper()
	label := x.method + " " + x.path
	in := c.checkRequest(label, x)
	resp, err := http.DefaultClient.Do(c.request(x))
	if err != nil {
		t.Fatalf("%s: %v", label, err)
	}
	defer resp.Body.Close()
	var first []byte
	if x.until != "" {
		first, err = readUntil(resp.Body, x.until)
		if err != nil {
			t.Fatalf("%s: %v", label, err)
		}
		resp.Body.Close() // the stream does not end: stop reading here
		resp.Body = io.NopCloser(bytes.NewReader(nil))
	}
	if during != nil {
		first, err = bufio.NewReader(io.LimitReader(resp.Body, 1<<20)).ReadBytes('\n')
		if err != nil {
			t.Fatalf("%s: no first line: %v", label, err)
		}
		during()
	}
	rest, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("%s: reading the response: %v", label, err)
	}
	body := append(first, rest...)
	if resp.StatusCode != x.status {
		t.Errorf("%s %s: status %d, want %d: %.300s", label, x.body, resp.StatusCode, x.status, body)
	}
	if in == nil {
		return resp.Header, body
	}
	c.checkResponse(label, in, resp, body)
	op := in.Route.Operation.OperationID
	if c.covered[op] == nil {
		c.covered[op] = map[int]bool{}
	}
	c.covered[op][resp.StatusCode] = true
	return resp.Header, body
}

// request builds the HTTP request of x.
func (c *contract) request(x exchange) *http.Request {
	req, err := http.NewRequest(x.method, c.srv.URL+x.path, bytes.NewReader(x.body))
	if err != nil {
		c.t.Fatalf("%s %s: %v", x.method, x.path, err)
	}
	if x.body != nil {
		ct := x.contentType
		if ct == "" {
			ct = "application/json"
		}
		req.Header.Set("Content-Type", ct)
	}
	if !x.noAuth {
		req.Header.Set("Authorization", "Bearer "+c.srv.Key)
	}
	for k, v := range x.header {
		req.Header.Set(k, v)
	}
	return req
}

// checkRequest finds x's operation and validates the request against it: valid, or invalid when x says so. It
// returns nil (after an error) when the document has no such operation.
func (c *contract) checkRequest(label string, x exchange) *openapi3filter.RequestValidationInput {
	t := c.t
	t.Helper()
	req := c.request(x)
	route, params, err := c.router.FindRoute(req)
	if err != nil {
		t.Errorf("%s: no operation in the document: %v", label, err)
		return nil
	}
	in := &openapi3filter.RequestValidationInput{Request: req, PathParams: params, Route: route,
		Options: &openapi3filter.Options{AuthenticationFunc: bearerPresent, SkipSettingDefaults: true}}
	err = openapi3filter.ValidateRequest(context.Background(), in)
	switch {
	case x.invalid && err == nil:
		t.Errorf("%s %s: the document accepts a request the test means to be invalid", label, x.body)
	case !x.invalid && err != nil:
		t.Errorf("%s %s: the request does not match the document: %v", label, x.body, err)
	}
	return in
}

// checkResponse validates status, content type, headers and body against the document; a response the document
// declares without content must have no body.
func (c *contract) checkResponse(label string, in *openapi3filter.RequestValidationInput, resp *http.Response, body []byte) {
	t := c.t
	t.Helper()
	out := &openapi3filter.ResponseValidationInput{RequestValidationInput: in, Status: resp.StatusCode,
		Header: resp.Header, Body: io.NopCloser(bytes.NewReader(body)),
		Options: &openapi3filter.Options{IncludeResponseStatus: true}}
	if err := openapi3filter.ValidateResponse(context.Background(), out); err != nil {
		t.Errorf("%s: the response (%d %s) does not match the document: %v\n%.500s", label, resp.StatusCode,
			resp.Header.Get("Content-Type"), err, body)
		return
	}
	if r := in.Route.Operation.Responses.Status(resp.StatusCode); r != nil && len(r.Value.Content) == 0 && len(body) > 0 {
		t.Errorf("%s: %d is declared without a body, got %.200q", label, resp.StatusCode, body)
	}
}

func bearerPresent(_ context.Context, in *openapi3filter.AuthenticationInput) error {
	if !strings.HasPrefix(in.RequestValidationInput.Request.Header.Get("Authorization"), "Bearer ") {
		return fmt.Errorf("no bearer key")
	}
	return nil
}

func (c *contract) json(b []byte, v any) {
	c.t.Helper()
	if err := json.Unmarshal(b, v); err != nil {
		c.t.Fatalf("%s: %v", b, err)
	}
}

func (c *contract) health() {
	c.do(exchange{method: "GET", path: "/healthz", status: 200, noAuth: true})
	c.do(exchange{method: "GET", path: "/v1/openapi.json", status: 200, noAuth: true})
}

type contractIDs struct{ a string }

const unknownID = "sbx_00000000000000000000000000000000"

func (c *contract) sandboxes() contractIDs {
	c.do(exchange{method: "POST", path: "/v1/sandboxes", body: []byte(`{}`), noAuth: true, status: 401, invalid: true})
	_, b := c.do(exchange{method: "POST", path: "/v1/sandboxes", status: 201,
		body: []byte(`{"metadata": {"suite": "contract"}, "env": {"A": "1"}, "timeout_s": 3600}`)})
	var sb struct{ ID string }
	c.json(b, &sb)
	for _, bad := range []string{`{"bogus": 1}`, `{"vcpu": "2"}`, `{"mem_mib": 1}`, `{"on_timeout": "explode"}`, `[]`, `{"ssh_pubkeys": "x"}`} {
		c.do(exchange{method: "POST", path: "/v1/sandboxes", body: []byte(bad), status: 400, invalid: true})
	}
	c.do(exchange{method: "POST", path: "/v1/sandboxes", body: []byte(`{"ssh_pubkeys": ["not a key"]}`), status: 400})
	for _, q := range []string{"", "?status=running", "?metadata%5Bsuite%5D=contract", "?status=running&metadata%5Bsuite%5D=contract"} {
		_, b := c.do(exchange{method: "GET", path: "/v1/sandboxes" + q, status: 200})
		var l struct{ Sandboxes []struct{ ID string } }
		c.json(b, &l)
		if !slices.ContainsFunc(l.Sandboxes, func(s struct{ ID string }) bool { return s.ID == sb.ID }) {
			c.t.Errorf("GET /v1/sandboxes%s does not list %s: %s", q, sb.ID, b)
		}
	}
	_, b = c.do(exchange{method: "GET", path: "/v1/sandboxes?metadata%5Bsuite%5D=other", status: 200})
	if strings.Contains(string(b), sb.ID) {
		c.t.Errorf("the metadata filter does not filter: %s", b)
	}
	c.do(exchange{method: "GET", path: "/v1/sandboxes?status=bogus", status: 400, invalid: true})
	c.do(exchange{method: "GET", path: "/v1/sandboxes/" + sb.ID, status: 200})
	c.do(exchange{method: "GET", path: "/v1/sandboxes/" + unknownID, status: 404})
	c.do(exchange{method: "GET", path: "/v1/sandboxes/not-an-id", status: 404, invalid: true})
	c.do(exchange{method: "GET", path: "/v1/sandboxes/" + sb.ID + "/wait?status=running&timeout_s=1", status: 200})
	c.do(exchange{method: "GET", path: "/v1/sandboxes/" + unknownID + "/wait?status=running", status: 404})
	for _, q := range []string{"", "?status=bogus", "?status=running&timeout_s=999", "?status=running&timeout_s=-1"} {
		c.do(exchange{method: "GET", path: "/v1/sandboxes/" + sb.ID + "/wait" + q, status: 400, invalid: true})
	}
	return contractIDs{a: sb.ID}
}

func (c *contract) runningCode(id string) {
	p := "/v1/sandboxes/" + id
	_, b := c.do(exchange{method: "POST", path: p + "/run_code", body: []byte(`{"code": "x = 41\nx + 1"}`), status: 200})
	if !strings.Contains(string(b), `"value":"42"`) {
		c.t.Errorf("run_code: %s", b)
	}
	c.do(exchange{method: "POST", path: p + "/run_code", body: []byte(`{"code": "print('a'); 1/0", "timeout_s": 30}`), status: 200})
	h, b := c.do(exchange{method: "POST", path: p + "/run_code", body: []byte(`{"code": "print('out')"}`),
		header: map[string]string{"Accept": "application/x-ndjson"}, status: 200})
	if h.Get("Content-Type") != "application/x-ndjson" || !strings.Contains(string(b), `"type":"result"`) {
		c.t.Errorf("run_code with Accept: application/x-ndjson: %s %s", h.Get("Content-Type"), b)
	}
	c.do(exchange{method: "POST", path: p + "/run_code", body: []byte(`{"code": "import sys; print('e', file=sys.stderr)", "stream": true}`), status: 200})
	// Rich results: display_data events in the stream, then the result's results (display_data, execute_result).
	rich := `{"code": "class T:\n    def _repr_html_(self): return '<b>t</b>'\ndisplay(T(), {'a': 1})\nT()", "stream": true}`
	_, b = c.do(exchange{method: "POST", path: p + "/run_code", body: []byte(rich), status: 200})
	if !strings.Contains(string(b), `{"type":"display_data","data":{"text/html":"\u003cb\u003et\u003c/b\u003e"`) ||
		!strings.Contains(string(b), `"results":[{"type":"display_data"`) || !strings.Contains(string(b), `{"type":"execute_result","data":{`) {
		c.t.Errorf("run_code with rich results: %s", b)
	}
	for _, bad := range []string{`{}`, `{"code": null}`, `{"code": 1}`, `{"code": "1", "bogus": 1}`, `{"code": "1", "timeout_s": -1}`} {
		c.do(exchange{method: "POST", path: p + "/run_code", body: []byte(bad), status: 400, invalid: true})
	}
	c.do(exchange{method: "POST", path: p + "/run_code", body: []byte(`{"code": "` + strings.Repeat("x", MaxJSONBody) + `"}`), status: 413})
	c.do(exchange{method: "POST", path: "/v1/sandboxes/" + unknownID + "/run_code", body: []byte(`{"code": "1"}`), status: 404})

	c.do(exchange{method: "POST", path: p + "/exec", body: []byte(`{"cmd": "echo hi; echo err >&2; exit 3"}`), status: 200})
	c.do(exchange{method: "POST", path: p + "/exec", body: []byte(`{"argv": ["ls", "/"], "cwd": "/tmp", "env": {"B": "2"}, "stdin": "x", "timeout_s": 10}`), status: 200})
	h, b = c.do(exchange{method: "POST", path: p + "/exec", body: []byte(`{"cmd": "echo a; echo b >&2"}`),
		header: map[string]string{"Accept": "application/x-ndjson"}, status: 200})
	if h.Get("Content-Type") != "application/x-ndjson" || !strings.Contains(string(b), `"type":"exit"`) {
		c.t.Errorf("exec with Accept: application/x-ndjson: %s %s", h.Get("Content-Type"), b)
	}
	c.do(exchange{method: "POST", path: p + "/exec", body: []byte(`{}`), status: 400, invalid: true})
	c.do(exchange{method: "POST", path: p + "/exec", body: []byte(`{"cmd": "ls", "argv": ["ls"]}`), status: 400, invalid: true})
	c.do(exchange{method: "POST", path: p + "/exec", body: []byte(`{"cmd": "ls", "cwd": "/missing"}`), status: 400})
	c.do(exchange{method: "POST", path: p + "/exec", body: []byte(`{"argv": "ls"}`), status: 400, invalid: true})
	c.do(exchange{method: "POST", path: "/v1/sandboxes/" + unknownID + "/exec", body: []byte(`{"cmd": "true"}`), status: 404})
	c.interrupt(id)
	c.keepalive(id)
	c.sshKeys(id)
}

// sshKeys authorizes keys on a sandbox (and refuses a line that is not a key); GET then shows them, and the
// server's ssh command (it runs with --ssh-listen).
func (c *contract) sshKeys(id string) {
	p := "/v1/sandboxes/" + id + "/ssh_keys"
	line := testPubkey(c.t)
	body, _ := json.Marshal(map[string]any{"keys": []string{line, line}})
	_, b := c.do(exchange{method: "POST", path: p, body: body, status: 200})
	var sb client.Sandbox
	c.json(b, &sb)
	if sb.SSH == nil || len(sb.SSH.Keys) != 1 || !strings.HasPrefix(sb.SSH.Keys[0].Fingerprint, "SHA256:") ||
		!strings.HasPrefix(sb.SSH.Command, "ssh -p ") || sb.SSH.KnownHosts == "" {
		c.t.Errorf("ssh_keys: %s", b)
	}
	c.do(exchange{method: "POST", path: p, body: []byte(`{"keys": ["ssh-ed25519 not-base64"]}`), status: 400})
	c.do(exchange{method: "POST", path: p, body: []byte(`{"keys": []}`), status: 400, invalid: true})
	c.do(exchange{method: "POST", path: "/v1/sandboxes/" + unknownID + "/ssh_keys", body: body, status: 404})
}

// testPubkey is a fresh ed25519 public key as an authorized_keys line.
func testPubkey(t *testing.T) string {
	pub, _, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	pk, err := ssh.NewPublicKey(pub)
	if err != nil {
		t.Fatal(err)
	}
	return strings.TrimSpace(string(ssh.MarshalAuthorizedKey(pk))) + " contract@test"
}

// keepalive sets a running sandbox's timeout from now, then clears it.
func (c *contract) keepalive(id string) {
	p := "/v1/sandboxes/" + id + "/timeout"
	_, b := c.do(exchange{method: "POST", path: p, body: []byte(`{"timeout_s": 3600}`), status: 200})
	if !strings.Contains(string(b), `"timeout_s":3600`) || strings.Contains(string(b), `"expires_at":null`) {
		c.t.Errorf("keepalive: %s", b)
	}
	c.do(exchange{method: "POST", path: p, body: []byte(`{"timeout_s": 0}`), status: 200})
	c.do(exchange{method: "POST", path: p, body: []byte(`{"timeout_s": -1}`), status: 400, invalid: true})
	c.do(exchange{method: "POST", path: p, body: []byte(`{}`), status: 400, invalid: true})
	c.do(exchange{method: "POST", path: "/v1/sandboxes/" + unknownID + "/timeout", body: []byte(`{"timeout_s": 5}`), status: 404})
}

// interrupt stops a streamed run_code once its first output line has arrived: the call ends with interrupted.
func (c *contract) interrupt(id string) {
	p := "/v1/sandboxes/" + id
	_, b := c.doWhile(exchange{method: "POST", path: p + "/run_code", status: 200,
		body: []byte(`{"code": "import time\nprint('started', flush=True)\ntime.sleep(600)", "stream": true}`)},
		func() {
			_, b := c.do(exchange{method: "POST", path: p + "/interrupt", body: []byte(`{"what": "run_code"}`), status: 200})
			if !strings.Contains(string(b), `"run_code":1`) {
				c.t.Errorf("interrupt: %s", b)
			}
		})
	if !strings.Contains(string(b), `"interrupted":true`) {
		c.t.Errorf("the interrupted run_code: %s", b)
	}
	c.do(exchange{method: "POST", path: p + "/interrupt", status: 200})
	c.do(exchange{method: "POST", path: p + "/interrupt", body: []byte(`{}`), status: 200})
	c.do(exchange{method: "POST", path: p + "/interrupt", body: []byte(`{"what": "everything"}`), status: 400, invalid: true})
	c.do(exchange{method: "POST", path: "/v1/sandboxes/" + unknownID + "/interrupt", status: 404})
}

func (c *contract) files(id string) {
	p := "/v1/sandboxes/" + id + "/files"
	oct := "application/octet-stream"
	c.do(exchange{method: "PUT", path: p + "?path=/root/a.txt&mode=0600", body: []byte("hello"), contentType: oct, status: 200})
	c.do(exchange{method: "PUT", path: p + "?path=relative.txt", body: []byte("x"), contentType: oct, status: 400})
	c.do(exchange{method: "PUT", path: p + "?path=/proc/x", body: []byte("x"), contentType: oct, status: 400})
	c.do(exchange{method: "PUT", path: p + "?path=/root/b.txt&mode=999", body: []byte("x"), contentType: oct, status: 400, invalid: true})
	_, b := c.do(exchange{method: "GET", path: p + "?path=/root/a.txt", status: 200})
	if string(b) != "hello" {
		c.t.Errorf("read back %q", b)
	}
	c.do(exchange{method: "GET", path: p + "?path=/root/missing", status: 404})
	c.do(exchange{method: "GET", path: p + "?path=/root", status: 400})
	c.do(exchange{method: "GET", path: p + "?path=/proc/self/status", status: 400})
	c.do(exchange{method: "GET", path: p, status: 400}) // neither path nor path_b64: the document cannot say "one of"
	c.do(exchange{method: "GET", path: p + "/list?path=/root", status: 200})
	c.do(exchange{method: "GET", path: p + "/list?path=/dev", status: 200})
	c.do(exchange{method: "GET", path: p + "/list?path=/proc", status: 400})
	c.do(exchange{method: "GET", path: p + "/list?path=/root/missing", status: 404})
	c.do(exchange{method: "GET", path: p + "/stat?path=/root/a.txt", status: 200})
	c.do(exchange{method: "GET", path: p + "/stat?path=/proc", status: 200})
	c.do(exchange{method: "GET", path: p + "/stat?path=/root/missing", status: 404})
	c.do(exchange{method: "POST", path: p + "/mkdir", body: []byte(`{"path": "/root/d/e"}`), status: 200})
	c.do(exchange{method: "POST", path: p + "/mkdir", body: []byte(`{"path": "/root/d/e", "parents": false}`), status: 409})
	c.do(exchange{method: "POST", path: p + "/mkdir", body: []byte(`{}`), status: 400})
	c.do(exchange{method: "GET", path: p + "/archive?path=/root", status: 200})
	c.do(exchange{method: "GET", path: p + "/archive?path=/proc", status: 400})
	c.do(exchange{method: "GET", path: p + "/archive?path=/root/a.txt", status: 400})
	c.do(exchange{method: "PUT", path: p + "/archive?path=/root/x", body: tarOf(c.t, "f.txt", "tar"), contentType: "application/x-tar", status: 200})
	c.do(exchange{method: "PUT", path: p + "/archive?path=/root/x", body: []byte("not a tar archive, not at all, no"), contentType: "application/x-tar", status: 400})
	c.do(exchange{method: "DELETE", path: p + "?path=/root/a.txt", status: 204})
	c.do(exchange{method: "DELETE", path: p + "?path=/root/a.txt", status: 404})
	c.do(exchange{method: "DELETE", path: p + "?path=/proc", status: 400})
	c.do(exchange{method: "DELETE", path: p + "?path=/root/d&recursive=true", status: 204})
	c.do(exchange{method: "GET", path: "/v1/sandboxes/" + unknownID + "/files/list?path=/", status: 404})

	// A name that is not UTF-8 ("caf\xe9", Latin-1): path_b64 in requests, name_b64 and path_b64 in answers.
	latin := base64.StdEncoding.EncodeToString([]byte("/root/raw/caf\xe9"))
	_, b = c.do(exchange{method: "PUT", path: p + "?path_b64=" + url.QueryEscape(latin), body: []byte("latin"), contentType: oct, status: 200})
	if !strings.Contains(string(b), `"path_b64":"`+latin+`"`) {
		c.t.Errorf("write by path_b64: %s", b)
	}
	_, b = c.do(exchange{method: "GET", path: p + "/list?path=/root/raw", status: 200})
	if !strings.Contains(string(b), `"name_b64":"`+base64.StdEncoding.EncodeToString([]byte("caf\xe9"))+`"`) {
		c.t.Errorf("list of a name that is not UTF-8: %s", b)
	}
	c.do(exchange{method: "GET", path: p + "/stat?path_b64=" + url.QueryEscape(latin), status: 200})
	if _, b = c.do(exchange{method: "GET", path: p + "?path_b64=" + url.QueryEscape(latin), status: 200}); string(b) != "latin" {
		c.t.Errorf("read by path_b64: %q", b)
	}
	c.do(exchange{method: "GET", path: p + "?path=/root/raw&path_b64=" + url.QueryEscape(latin), status: 400})
	c.do(exchange{method: "GET", path: p + "/stat?path_b64=%21%21", status: 400})
	c.do(exchange{method: "POST", path: p + "/mkdir", body: []byte(`{"path_b64": "` + base64.StdEncoding.EncodeToString([]byte("/root/raw/d\xe9")) + `"}`), status: 200})
	c.do(exchange{method: "POST", path: p + "/mkdir", body: []byte(`{"path": "/root/raw/x", "path_b64": "L3Jvb3QvcmF3L3g="}`), status: 400})
	c.do(exchange{method: "GET", path: p + "/archive?path_b64=" + url.QueryEscape(base64.StdEncoding.EncodeToString([]byte("/root/raw/d\xe9"))), status: 200})
	_, b = c.do(exchange{method: "PUT", path: p + "/archive?path_b64=" + url.QueryEscape(base64.StdEncoding.EncodeToString([]byte("/root/raw/d\xe9"))), body: tarOf(c.t, "f.txt", "tar"), contentType: "application/x-tar", status: 200})
	if !strings.Contains(string(b), `"path_b64"`) {
		c.t.Errorf("archive upload by path_b64: %s", b)
	}
	c.do(exchange{method: "DELETE", path: p + "?recursive=true&path_b64=" + url.QueryEscape(base64.StdEncoding.EncodeToString([]byte("/root/raw"))), status: 204})
}

func tarOf(t *testing.T, name, content string) []byte {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(content)), Typeflag: tar.TypeReg}); err != nil {
		t.Fatal(err)
	}
	tw.Write([]byte(content)) //nolint:errcheck // a bytes.Buffer
	tw.Close()
	return buf.Bytes()
}

func (c *contract) forkMergeDiff(id string) {
	p := "/v1/sandboxes/" + id
	_, b := c.do(exchange{method: "POST", path: p + "/fork", body: []byte(`{"n": 1}`), status: 200})
	var f struct{ Children []string }
	c.json(b, &f)
	if len(f.Children) != 1 {
		c.t.Fatalf("fork: %s", b)
	}
	kid := f.Children[0]
	c.do(exchange{method: "POST", path: p + "/fork", status: 200}) // no body: one child
	// A fork repeated with its Idempotency-Key (a client retrying after a broken connection) is done once.
	idem := map[string]string{"Idempotency-Key": "contract-fork-" + kid}
	_, first := c.do(exchange{method: "POST", path: p + "/fork", body: []byte(`{"n": 1}`), header: idem, status: 200})
	h, again := c.do(exchange{method: "POST", path: p + "/fork", body: []byte(`{"n": 1}`), header: idem, status: 200})
	if !bytes.Equal(first, again) || h.Get("Idempotent-Replayed") != "true" {
		c.t.Errorf("fork repeated with its Idempotency-Key: %s then %s (Idempotent-Replayed %q)", first, again, h.Get("Idempotent-Replayed"))
	}
	c.do(exchange{method: "POST", path: p + "/fork", body: []byte(`{"n": 2}`), header: idem, status: 422})
	c.do(exchange{method: "POST", path: p + "/fork", header: map[string]string{"Idempotency-Key": "two words"}, status: 400, invalid: true})
	for _, bad := range []string{`{"n": 0}`, `{"n": 33}`, `{"n": null}`, `{"n": "2"}`, `{"bogus": true}`} {
		c.do(exchange{method: "POST", path: p + "/fork", body: []byte(bad), status: 400, invalid: true})
	}
	c.do(exchange{method: "POST", path: "/v1/sandboxes/" + unknownID + "/fork", status: 404})
	c.outOfCapacity()

	c.do(exchange{method: "POST", path: "/v1/sandboxes/" + kid + "/exec", body: []byte(`{"cmd": "echo new > /root/kid.txt"}`), status: 200})
	_, b = c.do(exchange{method: "GET", path: p + "/diff/" + kid + "?paths=/root&paths=/tmp", status: 200})
	if !strings.Contains(string(b), "/root/kid.txt") {
		c.t.Errorf("diff: %s", b)
	}
	c.do(exchange{method: "GET", path: p + "/diff/" + kid, status: 200})
	c.do(exchange{method: "POST", path: p + "/diff/" + kid, body: []byte(`{"paths": ["/root"]}`), status: 200})
	c.do(exchange{method: "POST", path: p + "/diff/" + kid, status: 200})
	c.do(exchange{method: "GET", path: p + "/diff/" + kid + "?paths=root", status: 400})
	c.do(exchange{method: "POST", path: p + "/diff/" + kid, body: []byte(`{"paths": "/root"}`), status: 400, invalid: true})
	c.do(exchange{method: "GET", path: p + "/diff/" + unknownID, status: 404})
	// A path that is not UTF-8 in the diff: added_b64 beside added; paths_b64 in place of paths.
	c.do(exchange{method: "POST", path: "/v1/sandboxes/" + kid + "/exec", body: []byte(`{"cmd": "echo new > /root/caf$(printf '\\351')"}`), status: 200})
	rootB64 := base64.StdEncoding.EncodeToString([]byte("/root"))
	_, b = c.do(exchange{method: "GET", path: p + "/diff/" + kid + "?paths_b64=" + url.QueryEscape(rootB64), status: 200})
	if !strings.Contains(string(b), `"added_b64":[`) || !strings.Contains(string(b), base64.StdEncoding.EncodeToString([]byte("/root/caf\xe9"))) {
		c.t.Errorf("diff of a path that is not UTF-8: %s", b)
	}
	c.do(exchange{method: "POST", path: p + "/diff/" + kid, body: []byte(`{"paths_b64": ["` + rootB64 + `"]}`), status: 200})
	c.do(exchange{method: "POST", path: p + "/diff/" + kid, body: []byte(`{"paths": ["/root"], "paths_b64": ["` + rootB64 + `"]}`), status: 400})

	c.do(exchange{method: "POST", path: p + "/merge_into/" + id, status: 400})
	c.do(exchange{method: "POST", path: p + "/merge_into/" + kid, status: 204})
	c.do(exchange{method: "POST", path: p + "/merge_into/" + kid, status: 404})
}

// outOfCapacity asks for children whose memory limits would pass the server's bound (--mem-overcommit, 4 x the
// host's memory by default): 503, and nothing is made.
func (c *contract) outOfCapacity() {
	memMiB := hostMemMiB(c.t) * 9 / 10
	if memMiB > 262144 {
		c.t.Logf("host too large to reach the capacity bound with one sandbox's mem_mib: 503 not driven")
		return
	}
	_, b := c.do(exchange{method: "POST", path: "/v1/sandboxes", body: []byte(fmt.Sprintf(`{"mem_mib": %d}`, memMiB)), status: 201})
	var sb struct{ ID string }
	c.json(b, &sb)
	c.do(exchange{method: "POST", path: "/v1/sandboxes/" + sb.ID + "/fork", body: []byte(`{"n": 5}`), status: 503})
	c.do(exchange{method: "DELETE", path: "/v1/sandboxes/" + sb.ID, status: 204})
}

func hostMemMiB(t *testing.T) int {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		t.Fatal(err)
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == "MemTotal:" {
			kb, _ := strconv.Atoi(f[1])
			return kb / 1024
		}
	}
	t.Fatal("no MemTotal in /proc/meminfo")
	return 0
}

func (c *contract) pauseResume(id string) {
	p := "/v1/sandboxes/" + id
	c.do(exchange{method: "POST", path: p + "/resume", status: 200}) // already running
	h, _ := c.do(exchange{method: "POST", path: p + "/pause", status: 202})
	if h.Get("X-Poll-After") == "" {
		c.t.Error("pause: no X-Poll-After")
	}
	c.do(exchange{method: "GET", path: p + "/wait?status=paused&timeout_s=60", status: 200})
	c.do(exchange{method: "POST", path: p + "/pause", status: 200}) // already paused
	c.do(exchange{method: "POST", path: p + "/run_code", body: []byte(`{"code": "1"}`), status: 409})
	c.do(exchange{method: "POST", path: p + "/exec", body: []byte(`{"cmd": "true"}`), status: 409})
	c.do(exchange{method: "GET", path: p + "/files/stat?path=/root", status: 409})
	c.do(exchange{method: "POST", path: p + "/interrupt", status: 409})
	c.do(exchange{method: "POST", path: p + "/resume", status: 202})
	_, b := c.do(exchange{method: "GET", path: p + "/wait?status=running&timeout_s=60", status: 200})
	if !strings.Contains(string(b), `"status":"running"`) {
		c.t.Fatalf("resume: %s", b)
	}
	c.do(exchange{method: "POST", path: "/v1/sandboxes/" + unknownID + "/pause", status: 404})
	c.do(exchange{method: "POST", path: "/v1/sandboxes/" + unknownID + "/resume", status: 404})
}

// templates captures a running sandbox, starts one from the template, and the errors: bad name, taken name,
// unknown sandbox or template.
func (c *contract) templates(id string) {
	c.do(exchange{method: "POST", path: "/v1/templates", body: []byte(`{"name": "ct", "from": "` + id + `"}`), status: 201})
	c.do(exchange{method: "POST", path: "/v1/templates", body: []byte(`{"name": "ct", "from": "` + id + `"}`), status: 409})
	c.do(exchange{method: "POST", path: "/v1/templates", body: []byte(`{"name": "Bad Name", "from": "` + id + `"}`), status: 400, invalid: true})
	c.do(exchange{method: "POST", path: "/v1/templates", body: []byte(`{"name": "ct2", "from": "` + unknownID + `"}`), status: 404})
	c.do(exchange{method: "POST", path: "/v1/templates", body: []byte(`{"name": "ct2"}`), status: 400, invalid: true})
	c.do(exchange{method: "GET", path: "/v1/templates", status: 200})
	c.do(exchange{method: "GET", path: "/v1/templates/ct", status: 200})
	c.do(exchange{method: "GET", path: "/v1/templates/none", status: 404})
	_, b := c.do(exchange{method: "POST", path: "/v1/sandboxes", body: []byte(`{"template": "ct", "mem_mib": 256}`), status: 201})
	var sb struct{ ID, Template string }
	if json.Unmarshal(b, &sb) != nil || sb.Template != "ct" {
		c.t.Fatalf("create from a template: %s", b)
	}
	c.do(exchange{method: "DELETE", path: "/v1/sandboxes/" + sb.ID, status: 204})
	c.do(exchange{method: "POST", path: "/v1/sandboxes", body: []byte(`{"template": "none"}`), status: 404})
	c.do(exchange{method: "DELETE", path: "/v1/templates/ct", status: 204})
	c.do(exchange{method: "DELETE", path: "/v1/templates/ct", status: 404})
}

// images builds a named image (streamed, and plain), starts a sandbox on it, and the errors: bad names, no pip
// index, unknown images, a rebuild or delete of an image in use, the default image's delete.
func (c *contract) images() {
	nd := map[string]string{"Accept": "application/x-ndjson"}
	_, b := c.do(exchange{method: "POST", path: "/v1/images", body: []byte(`{"name": "ct-img", "apt": ["tree"]}`), header: nd, status: 200})
	if !strings.Contains(string(b), `"type":"done"`) || !strings.Contains(string(b), `"type":"progress"`) {
		c.t.Errorf("image build stream: %s", b)
	}
	c.do(exchange{method: "POST", path: "/v1/images", body: []byte(`{"name": "ct-img2", "apt": ["tree"]}`), status: 201})
	c.do(exchange{method: "POST", path: "/v1/images", body: []byte(`{"name": "Bad Name", "apt": ["tree"]}`), status: 400, invalid: true})
	c.do(exchange{method: "POST", path: "/v1/images", body: []byte(`{"name": "ct-x", "pip": ["attrs"]}`), status: 400})
	c.do(exchange{method: "GET", path: "/v1/images", status: 200})
	c.do(exchange{method: "GET", path: "/v1/images/ct-img", status: 200})
	c.do(exchange{method: "GET", path: "/v1/images/default", status: 200})
	c.do(exchange{method: "GET", path: "/v1/images/none", status: 404})
	_, b = c.do(exchange{method: "POST", path: "/v1/sandboxes", body: []byte(`{"image": "ct-img"}`), status: 201})
	var sb struct{ ID, Image string }
	c.json(b, &sb)
	if sb.Image != "ct-img" {
		c.t.Errorf("sandbox on ct-img: %s", b)
	}
	c.do(exchange{method: "POST", path: "/v1/sandboxes", body: []byte(`{"image": "none"}`), status: 404})
	c.do(exchange{method: "POST", path: "/v1/sandboxes", body: []byte(`{"image": "Bad Name"}`), status: 400, invalid: true})
	c.do(exchange{method: "POST", path: "/v1/images", body: []byte(`{"name": "ct-img", "apt": ["tree"]}`), status: 409})
	c.do(exchange{method: "DELETE", path: "/v1/images/ct-img", status: 409})
	c.deleteSandbox(sb.ID)
	c.do(exchange{method: "DELETE", path: "/v1/images/ct-img", status: 204})
	c.do(exchange{method: "DELETE", path: "/v1/images/ct-img", status: 404})
	c.do(exchange{method: "DELETE", path: "/v1/images/ct-img2", status: 204})
	c.do(exchange{method: "DELETE", path: "/v1/images/default", status: 400})
}

func (c *contract) deleteSandbox(id string) {
	c.do(exchange{method: "DELETE", path: "/v1/sandboxes/" + id, status: 204})
	c.do(exchange{method: "DELETE", path: "/v1/sandboxes/" + id, status: 404})
}

// methodsAndRoutes checks what info.description says: a listed path with a method it does not list is 405 with an
// Allow header naming exactly the listed methods; a path not listed is 404. Both are JSON errors.
func (c *contract) methodsAndRoutes() {
	t := c.t
	for path, item := range c.doc.Paths.Map() {
		var listed []string
		for m := range item.Operations() {
			listed = append(listed, m)
		}
		if item.Patch != nil {
			continue // PATCH is one of the path's methods (the ports route forwards every method)
		}
		url := c.srv.URL + strings.NewReplacer("{id}", unknownID, "{winner}", unknownID, "{other}", unknownID, "{name}", "none").Replace(path)
		req, _ := http.NewRequest("PATCH", url, nil)
		req.Header.Set("Authorization", "Bearer "+c.srv.Key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		var allow []string
		for _, m := range strings.Split(resp.Header.Get("Allow"), ",") {
			if m = strings.TrimSpace(m); m != "" && m != "HEAD" {
				allow = append(allow, m)
			}
		}
		sort.Strings(listed)
		sort.Strings(allow)
		var e struct{ Error string }
		if resp.StatusCode != 405 || json.Unmarshal(b, &e) != nil || e.Error == "" || !slices.Equal(allow, listed) {
			t.Errorf("PATCH %s: %d Allow %q %s; want 405, a JSON error and Allow %v", path, resp.StatusCode, allow, b, listed)
		}
	}
	resp, err := http.Get(c.srv.URL + "/v1/nothing")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 404 || !strings.Contains(string(b), `"error":"no such route`) {
		t.Errorf("GET /v1/nothing: %d %s", resp.StatusCode, b)
	}
}

// everyOperationCovered fails for an operation of the document the test did not drive.
func (c *contract) everyOperationCovered() {
	var missing, seen []string
	for path, item := range c.doc.Paths.Map() {
		for m, op := range item.Operations() {
			st := c.covered[op.OperationID]
			if len(st) == 0 {
				missing = append(missing, m+" "+path+" ("+op.OperationID+")")
				continue
			}
			var codes []string
			for s := range st {
				codes = append(codes, strconv.Itoa(s))
			}
			sort.Strings(codes)
			seen = append(seen, fmt.Sprintf("%s: %s", op.OperationID, strings.Join(codes, " ")))
		}
	}
	sort.Strings(seen)
	c.t.Logf("statuses checked per operation:\n  %s", strings.Join(seen, "\n  "))
	if len(missing) > 0 {
		sort.Strings(missing)
		c.t.Errorf("operations of openapi.json the contract test does not drive:\n  %s", strings.Join(missing, "\n  "))
	}
}

// observe drives the metrics, the event stream (read up to a replayed event of the sandbox) and the logs.
func (c *contract) observe(id string) {
	_, b := c.do(exchange{method: "GET", path: "/metrics", status: 200})
	if !strings.Contains(string(b), "ramify_sandboxes{") {
		c.t.Errorf("/metrics: no ramify_sandboxes series in %.300s", b)
	}
	c.do(exchange{method: "GET", path: "/metrics", noAuth: true, status: 401, invalid: true})
	// An id from before this server's run: the whole history is replayed, the sandbox's creation included.
	c.do(exchange{method: "GET", path: "/v1/events?sandbox=" + id + "&last_event_id=1", status: 200,
		until: "event: created"})
	c.do(exchange{method: "GET", path: "/v1/events", header: map[string]string{"Last-Event-ID": "1"}, status: 200,
		until: "event: created"})
	c.do(exchange{method: "GET", path: "/v1/events?sandbox=not-an-id", status: 400})
	c.do(exchange{method: "GET", path: "/v1/events?last_event_id=x", status: 400, invalid: true})
	_, b = c.do(exchange{method: "GET", path: "/v1/sandboxes/" + id + "/logs", status: 200})
	if !strings.Contains(string(b), `"lines":`) {
		c.t.Errorf("logs: %s", b)
	}
	c.do(exchange{method: "GET", path: "/v1/sandboxes/" + unknownID + "/logs", status: 404})
}

// ingress drives the ports route: an ingress-enabled sandbox running python's http.server on port 8000 (every
// method but GET answers 501: the app's own response, passed on), and the route's own errors.
func (c *contract) ingress(notEnabled string) {
	_, b := c.do(exchange{method: "POST", path: "/v1/sandboxes", body: []byte(`{"ingress_enabled": true}`), status: 201})
	var sb struct {
		ID      string
		Ingress struct{ Enabled bool }
	}
	c.json(b, &sb)
	if !sb.Ingress.Enabled {
		c.t.Fatalf("created with ingress_enabled: %s", b)
	}
	p := "/v1/sandboxes/" + sb.ID + "/ports/"
	c.do(exchange{method: "GET", path: p + "8000/hello.txt", status: 502})
	// Bound, then detached: the port listens when the exec returns.
	res, err := c.srv.Client.Exec(context.Background(), sb.ID, client.ExecRequest{Cmd: `mkdir -p /srv && echo hello > /srv/hello.txt && python3 -c "
import http.server, os, functools
s = http.server.ThreadingHTTPServer(('0.0.0.0', 8000), functools.partial(http.server.SimpleHTTPRequestHandler, directory='/srv'))
os.fork() and os._exit(0)
os.setsid()
s.serve_forever()" </dev/null >/dev/null 2>&1`})
	if err != nil || res.ExitCode != 0 {
		c.t.Fatalf("start http.server: %v %+v", err, res)
	}
	_, b = c.do(exchange{method: "GET", path: p + "8000/hello.txt?x=1", status: 200})
	if string(b) != "hello\n" {
		c.t.Errorf("GET through the ports route: %q", b)
	}
	// Without a body: http.server answers these 501 and closes the connection without reading one, and unread
	// bytes make that close a reset, which the proxy could meet before the answer (a 502 now and then).
	for _, m := range []string{"POST", "PUT", "PATCH", "DELETE", "OPTIONS"} {
		c.do(exchange{method: m, path: p + "8000/hello.txt", status: 501})
	}
	c.do(exchange{method: "GET", path: p + "0/x", status: 400, invalid: true})
	c.do(exchange{method: "GET", path: p + "8000/x", noAuth: true, status: 401, invalid: true})
	c.do(exchange{method: "GET", path: "/v1/sandboxes/" + unknownID + "/ports/8000/x", status: 404})
	c.do(exchange{method: "GET", path: "/v1/sandboxes/" + notEnabled + "/ports/8000/x", status: 404})
	c.do(exchange{method: "DELETE", path: "/v1/sandboxes/" + sb.ID, status: 204})
}
