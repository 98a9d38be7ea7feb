package api

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ramify-dev/ramify/internal/agent"
	"github.com/ramify-dev/ramify/internal/runtime"
	"github.com/ramify-dev/ramify/internal/sandbox"
	"github.com/ramify-dev/ramify/internal/store"
)

// FuzzRequestBodies sends arbitrary bodies to the API's JSON endpoints (create, run_code, exec, fork, mkdir,
// diff, merge_into) and to the archive upload, through the real handler stack (routing, auth, decode, the
// sandbox service's validation) in front of a runtime that runs nothing: every call that gets past validation
// ends at the runtime with errReached. The response must then be
//   - a 4xx with a JSON body {"error": "<non-empty message>"}, for anything the client got wrong;
//   - or a 5xx only for errReached (the request was valid and reached the runtime), or a 2xx;
// and a body the handlers' decoder refuses (not one JSON object of the endpoint's fields) is a 400 or 413.
// Nothing may panic.

var errReached = errors.New("fuzz: the request reached the runtime")

// fuzzRuntime is a runtime with two running sandboxes and no processes. Methods it does not define panic (the
// embedded interface is nil): a request reaching one is a finding too.
type fuzzRuntime struct {
	runtime.Runtime
	root, upper, lower string
}

func (r *fuzzRuntime) Create(context.Context, runtime.Spec) (runtime.Handle, error) {
	return runtime.Handle{}, errReached
}
func (r *fuzzRuntime) Destroy(context.Context, runtime.Handle) error { return nil }
func (r *fuzzRuntime) Recover(context.Context, runtime.Handle) error { return nil }
func (r *fuzzRuntime) Agent(string) (*agent.Client, error)           { return nil, errReached }
func (r *fuzzRuntime) RootPath(runtime.Handle) string                { return r.root }
func (r *fuzzRuntime) Configure(context.Context, runtime.Handle, runtime.Spec) error {
	return errReached
}
func (r *fuzzRuntime) Usage(runtime.Handle) (runtime.Usage, error) { return runtime.Usage{}, nil }
func (r *fuzzRuntime) Close() error                                { return nil }
func (r *fuzzRuntime) Fork(context.Context, runtime.Handle, []runtime.Spec) (runtime.ForkResult, error) {
	return runtime.ForkResult{}, errReached
}
func (r *fuzzRuntime) Swap(context.Context, runtime.Handle, runtime.Handle) (runtime.Handle, error) {
	return runtime.Handle{}, errReached
}
func (r *fuzzRuntime) UpperDir(runtime.Handle) string               { return r.upper }
func (r *fuzzRuntime) Freeze(context.Context, runtime.Handle) error { return errReached }
func (r *fuzzRuntime) Thaw(context.Context, runtime.Handle) error   { return nil }
func (r *fuzzRuntime) LowerDirs(runtime.Handle) ([]string, error)   { return []string{r.lower}, nil }

type noIPs struct{}

func (noIPs) Allocate(func(net.IP) bool) (net.IP, error) { return nil, errReached }

const fuzzKey = "fuzz-key"

// fuzzServer starts the API on a store holding two running sandboxes and returns it with their ids.
func fuzzServer(f *testing.F) (*Server, *fuzzRuntime, string, string) {
	dir := f.TempDir()
	rt := &fuzzRuntime{root: filepath.Join(dir, "root"), upper: filepath.Join(dir, "upper"), lower: filepath.Join(dir, "lower")}
	for _, d := range []string{rt.root, rt.upper, rt.lower} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			f.Fatal(err)
		}
	}
	st, err := store.Open(dir)
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { st.Close() })
	a, b := sandbox.NewID(), sandbox.NewID()
	for i, id := range []string{a, b} {
		h, _ := json.Marshal(runtime.Handle{ID: id, FamilyID: "fam_" + id[4:]})
		spec, _ := json.Marshal(sandbox.CreateRequest{VCPU: 1, MemMiB: 1024, MaxProcs: 512, Cwd: "/root", OnTimeout: "destroy"})
		rec := store.Record{ID: id, Status: string(sandbox.StatusRunning), FamilyID: "fam_" + id[4:],
			IP: net.IPv4(10, 99, 0, byte(2+i)).String(), Hostname: "sbx-" + id[4:12], CreatedAt: time.Now().UTC(),
			Spec: spec, Handle: h}
		if err := st.Put(context.Background(), rec); err != nil {
			f.Fatal(err)
		}
	}
	log := slog.New(slog.DiscardHandler)
	svc, err := sandbox.New(context.Background(), sandbox.Config{Store: st, Runtime: rt, IPs: noIPs{}, Logger: log,
		HostUID: os.Getuid(), HostGID: os.Getgid()})
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(svc.Close)
	return New(svc, fuzzKey, "fuzz", log), rt, a, b
}

// fuzzRoute is one endpoint that reads a body; body is the type its handler decodes into (nil: not JSON).
type fuzzRoute struct {
	method, path string
	body         func() any
}

func fuzzRoutes(a, b string) []fuzzRoute {
	return []fuzzRoute{
		{"POST", "/v1/sandboxes", func() any { return new(sandbox.CreateRequest) }},
		{"POST", "/v1/sandboxes/" + a + "/run_code", func() any { return new(sandbox.RunCodeRequest) }},
		{"POST", "/v1/sandboxes/" + a + "/exec", func() any { return new(sandbox.ExecRequest) }},
		{"POST", "/v1/sandboxes/" + a + "/fork", func() any {
			return new(struct {
				N           *int `json:"n"`
				StartPaused bool `json:"start_paused"`
			})
		}},
		{"POST", "/v1/sandboxes/" + a + "/files/mkdir", func() any {
			return new(struct {
				Path    string `json:"path"`
				Parents *bool  `json:"parents"`
			})
		}},
		{"POST", "/v1/sandboxes/" + a + "/diff/" + b, func() any {
			return new(struct {
				Paths []string `json:"paths"`
			})
		}},
		{"POST", "/v1/sandboxes/" + a + "/merge_into/" + b, nil},
		{"PUT", "/v1/sandboxes/" + a + "/files/archive?path=/up", nil},
		{"POST", "/v1/sandboxes/" + "sbx_" + strings.Repeat("0", 32) + "/run_code", func() any { return new(sandbox.RunCodeRequest) }},
	}
}

// strictDecode is the contract of the handlers' decoder: one JSON object (or nothing, where the body is
// optional) of the endpoint's fields, and nothing after it.
func strictDecode(body []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return err
	}
	if dec.More() {
		return errors.New("trailing data")
	}
	return nil
}

func FuzzRequestBodies(f *testing.F) {
	bodies := []string{
		``, `{}`, `null`, `[]`, `"x"`, `{"vcpu":2,"mem_mib":512,"env":{"A":"1"},"metadata":{"k":"v"}}`,
		`{"vcpu":1e400}`, `{"vcpu":-1}`, `{"mem_mib":1.5}`, `{"env":{"A=B":"x"}}`, `{"cwd":"rel"}`, `{"unknown":1}`,
		`{"code":"print(1)","timeout_s":5}`, `{"code":"x","timeout_s":-1}`, `{"code":"x","timeout_s":1e308}`,
		`{"cmd":"ls","argv":["ls"]}`, `{"argv":["ls","-l"],"cwd":"/tmp","env":{"X":"\u0000"}}`, `{"cmd":""}`,
		`{"n":3}`, `{"n":0}`, `{"n":9999999999999999999}`, `{"n":null,"start_paused":true}`,
		`{"path":"/a/b","parents":false}`, `{"path":"../../etc"}`, `{"path":"/\u0000"}`,
		`{"paths":["/root","/tmp"]}`, `{"paths":["rel"]}`, `{"paths":null}`, `{} {}`, `{}x`, `{"a":`, "\xff",
		`{"code":"` + strings.Repeat("a", 5000) + `"}`, strings.Repeat("[", 20000), `{"metadata":{"":"v"}}`,
	}
	srv, rt, a, b := fuzzServer(f)
	routes := fuzzRoutes(a, b)
	for r := range routes {
		for _, s := range bodies {
			f.Add([]byte(s), uint8(r))
		}
	}
	f.Fuzz(func(t *testing.T, body []byte, which uint8) {
		route := routes[int(which)%len(routes)]
		req := httptest.NewRequest(route.method, route.path, bytes.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+fuzzKey)
		rec := httptest.NewRecorder()
		srv.ServeHTTP(rec, req)
		code := rec.Code
		what := route.method + " " + route.path
		switch {
		case code >= 200 && code < 300:
		case code >= 400 && code < 500:
			var e map[string]any
			if err := json.Unmarshal(rec.Body.Bytes(), &e); err != nil {
				t.Fatalf("%s: %d with a body that is not JSON: %q", what, code, rec.Body.String())
			}
			if msg, ok := e["error"].(string); !ok || msg == "" || len(e) != 1 {
				t.Fatalf(`%s: %d with body %q, want {"error": "..."}`, what, code, rec.Body.String())
			}
		default:
			if !strings.Contains(rec.Body.String(), errReached.Error()) {
				t.Fatalf("%s with body %.200q: %d %s", what, body, code, rec.Body.String())
			}
		}
		if route.body != nil && len(bytes.TrimSpace(body)) > 0 {
			if err := strictDecode(body, route.body()); err != nil && code != 400 && code != 413 {
				t.Fatalf("%s: a body the decoder refuses (%v) answered %d", what, err, code)
			}
		}
		if strings.Contains(route.path, "archive") {
			os.RemoveAll(filepath.Join(rt.root, "up"))
		}
		if strings.Contains(route.path, "mkdir") {
			ents, _ := os.ReadDir(rt.root)
			for _, e := range ents {
				os.RemoveAll(filepath.Join(rt.root, e.Name()))
			}
		}
	})
}
