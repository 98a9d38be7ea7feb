package integration

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os/exec"
	"strings"
	"testing"

	"github.com/ramify-dev/ramify/client"
	"github.com/ramify-dev/ramify/internal/testserver"
)

// ingressApp is the app the ingress tests run inside a sandbox (python3 /tmp/app.py PORT): it binds, then
// detaches, so that the exec that starts it returns once the port listens. Any method and path answers JSON
// describing the request; /stream sends one line, waits until /release is requested, sends another; /ws answers
// an Upgrade with 101 and echoes bytes (the upgrade path, without a WebSocket library).
const ingressApp = `import http.server, json, os, sys, threading
released = threading.Event()
class H(http.server.BaseHTTPRequestHandler):
    protocol_version = 'HTTP/1.1'
    def log_message(self, *a): pass
    def answer(self):
        if self.path == '/stream':
            self.send_response(200); self.send_header('Content-Type', 'text/plain'); self.send_header('Transfer-Encoding', 'chunked'); self.end_headers()
            for line, wait in ((b'first\n', True), (b'second\n', False)):
                self.wfile.write(b'%x\r\n%s\r\n' % (len(line), line)); self.wfile.flush()
                if wait: released.wait(60)
            self.wfile.write(b'0\r\n\r\n'); return
        if self.path == '/release':
            released.set()
        if self.path == '/ws' and self.headers.get('Upgrade', '').lower() == 'websocket':
            self.send_response(101); self.send_header('Upgrade', 'websocket'); self.send_header('Connection', 'Upgrade'); self.end_headers(); self.wfile.flush()
            while True:
                b = self.connection.recv(4096)
                if not b: break
                self.connection.sendall(b)
            self.close_connection = True; return
        n = int(self.headers.get('Content-Length') or 0)
        body = json.dumps({'method': self.command, 'path': self.path, 'host': self.headers.get('Host'),
            'authorization': self.headers.get('Authorization'), 'x_api_key': self.headers.get('X-Api-Key'),
            'body': self.rfile.read(n).decode()}).encode()
        self.send_response(200); self.send_header('Content-Type', 'application/json'); self.send_header('Content-Length', str(len(body))); self.end_headers()
        self.wfile.write(body)
    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = do_OPTIONS = answer
srv = http.server.ThreadingHTTPServer(('0.0.0.0', int(sys.argv[1])), H)
if os.fork(): os._exit(0)
os.setsid(); fd = os.open('/dev/null', os.O_RDWR)
for i in (0, 1, 2): os.dup2(fd, i)
srv.serve_forever()
`

// startIngressApp runs ingressApp on port in sandbox id; it listens when this returns.
func startIngressApp(t *testing.T, s *testserver.Server, id string, port int) {
	t.Helper()
	if _, err := s.Client.WriteFile(ctxT(t), id, "/tmp/app.py", strings.NewReader(ingressApp), 0o644); err != nil {
		t.Fatalf("write app: %v", err)
	}
	if r := sh(t, s, id, fmt.Sprintf("python3 /tmp/app.py %d", port)); r.ExitCode != 0 {
		t.Fatalf("start app in %s: %+v", id, r)
	}
}

// ingressRoute is one of the two ways to a sandbox's port: the ingress listener (by Host) or the API route.
type ingressRoute struct {
	name string
	// request makes a request for path (with query) on port of sandbox id.
	request func(method, id string, port int, path string, body io.Reader) *http.Request
	// dial opens a connection that the request's bytes can be written to (for the upgrade test).
	addr string
}

func ingressRoutes(t *testing.T, s *testserver.Server, ingressAddr string) []ingressRoute {
	return []ingressRoute{
		{name: "host", addr: ingressAddr, request: func(method, id string, port int, path string, body io.Reader) *http.Request {
			req, err := http.NewRequest(method, "http://"+ingressAddr+path, body)
			if err != nil {
				t.Fatal(err)
			}
			req.Host = fmt.Sprintf("%d-%s.localhost:%s", port, strings.TrimPrefix(id, "sbx_"), portOfAddr(ingressAddr))
			return req
		}},
		{name: "api", addr: strings.TrimPrefix(s.URL, "http://"), request: func(method, id string, port int, path string, body io.Reader) *http.Request {
			req, err := http.NewRequest(method, fmt.Sprintf("%s/v1/sandboxes/%s/ports/%d%s", s.URL, id, port, path), body)
			if err != nil {
				t.Fatal(err)
			}
			req.Header.Set("Authorization", "Bearer "+s.Key)
			return req
		}},
	}
}

func portOfAddr(a string) string {
	_, p, _ := net.SplitHostPort(a)
	return p
}

// do sends req and returns the status and body.
func doReq(t *testing.T, req *http.Request) (int, []byte) {
	t.Helper()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s (Host %s): %v", req.Method, req.URL, req.Host, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

// wantJSONError checks a JSON error response of the given status whose message contains msg.
func wantJSONError(t *testing.T, what string, code int, b []byte, wantCode int, msg string) {
	t.Helper()
	var e struct{ Error string }
	if code != wantCode || json.Unmarshal(b, &e) != nil || !strings.Contains(e.Error, msg) {
		t.Errorf("%s: %d %s; want %d and a JSON error containing %q", what, code, b, wantCode, msg)
	}
}

func TestIngress(t *testing.T) {
	// 0.0.0.0: the listener is on the bridge address too, so that the isolation checks can aim at it.
	s := testserver.Start(t, "--ingress-listen", "0.0.0.0:0")
	ctx := ctxT(t)
	a, err := s.Client.Create(ctx, client.CreateRequest{IngressEnabled: true})
	if err != nil {
		t.Fatal(err)
	}
	if !a.Ingress.Enabled || !strings.HasPrefix(a.Ingress.URLTemplate, "http://{port}-"+a.ID[4:]+".localhost:") ||
		a.Ingress.PathTemplate != "/v1/sandboxes/"+a.ID+"/ports/{port}/" {
		t.Fatalf("create's ingress: %+v", a.Ingress)
	}
	u, err := url.Parse(a.Ingress.URL(8000))
	if err != nil {
		t.Fatal(err)
	}
	ingressAddr := "127.0.0.1:" + u.Port()
	b := create(t, s, nil) // not ingress-enabled
	if sb, _ := s.Client.Get(ctx, b); sb.Ingress.Enabled || sb.Ingress.URLTemplate != "" {
		t.Fatalf("default sandbox's ingress: %+v", sb.Ingress)
	}
	startIngressApp(t, s, a.ID, 8000)
	startIngressApp(t, s, b, 8000)
	routes := ingressRoutes(t, s, ingressAddr)

	t.Run("MethodPathQueryForwarded", func(t *testing.T) {
		for _, r := range routes {
			for _, m := range []string{"GET", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"} {
				req := r.request(m, a.ID, 8000, "/some/p%20th?q=1&r=two", strings.NewReader("payload"))
				req.Header.Set("X-Api-Key", "not-forwarded-when-it-is-the-key")
				code, body := doReq(t, req)
				var got map[string]any
				if code != 200 || json.Unmarshal(body, &got) != nil {
					t.Fatalf("%s %s: %d %s", r.name, m, code, body)
				}
				if got["method"] != m || got["path"] != "/some/p%20th?q=1&r=two" || got["body"] != "payload" {
					t.Errorf("%s %s: the app saw %v", r.name, m, got)
				}
				if got["authorization"] != nil {
					t.Errorf("%s %s: the API key reached the sandbox: %v", r.name, m, got)
				}
				wantHost := req.Host
				if r.name == "api" {
					wantHost = a.IP + ":8000"
				}
				if got["host"] != wantHost {
					t.Errorf("%s %s: Host %v, want %s", r.name, m, got["host"], wantHost)
				}
			}
		}
		// With the key in X-Api-Key, that header is dropped and Authorization (the app's own) passes.
		req := routes[1].request("GET", a.ID, 8000, "/", nil)
		req.Header.Del("Authorization")
		req.Header.Set("X-Api-Key", s.Key)
		code, body := doReq(t, req)
		if code != 200 || strings.Contains(string(body), s.Key) {
			t.Errorf("api route with X-Api-Key: %d %s", code, body)
		}
	})

	t.Run("CurlResolvesLocalhost", func(t *testing.T) {
		if _, err := exec.LookPath("curl"); err != nil {
			t.Skip("no curl")
		}
		out, err := exec.Command("curl", "-sS", a.Ingress.URL(8000)+"curl").CombinedOutput()
		if err != nil || !strings.Contains(string(out), `"path": "/curl"`) {
			t.Errorf("curl %s: %v %s", a.Ingress.URL(8000), err, out)
		}
	})

	t.Run("Streaming", func(t *testing.T) {
		for _, r := range routes {
			resp, err := http.DefaultClient.Do(r.request("GET", a.ID, 8000, "/stream", nil))
			if err != nil {
				t.Fatal(err)
			}
			br := bufio.NewReader(resp.Body)
			// The first line arrives while the app still holds the response open.
			if line, err := br.ReadString('\n'); err != nil || line != "first\n" {
				t.Fatalf("%s: first line %q %v", r.name, line, err)
			}
			if code, body := doReq(t, r.request("GET", a.ID, 8000, "/release", nil)); code != 200 {
				t.Fatalf("%s: release: %d %s", r.name, code, body)
			}
			rest, err := io.ReadAll(br)
			resp.Body.Close()
			if err != nil || string(rest) != "second\n" {
				t.Fatalf("%s: rest %q %v", r.name, rest, err)
			}
			// The app's event is set now; a new stream would not wait. Restart the app for the next route.
			sh(t, s, a.ID, "pkill -f 'app.py 8000'; true")
			startIngressApp(t, s, a.ID, 8000)
		}
	})

	t.Run("Upgrade", func(t *testing.T) {
		for _, r := range routes {
			req := r.request("GET", a.ID, 8000, "/ws", nil)
			conn, err := net.Dial("tcp", r.addr)
			if err != nil {
				t.Fatal(err)
			}
			defer conn.Close()
			req.Header.Set("Connection", "Upgrade")
			req.Header.Set("Upgrade", "websocket")
			if err := req.Write(conn); err != nil {
				t.Fatal(err)
			}
			br := bufio.NewReader(conn)
			resp, err := http.ReadResponse(br, req)
			if err != nil || resp.StatusCode != 101 || !strings.EqualFold(resp.Header.Get("Upgrade"), "websocket") {
				t.Fatalf("%s: upgrade: %v %+v", r.name, err, resp)
			}
			for _, msg := range []string{"hello\n", "again\n"} {
				if _, err := conn.Write([]byte(msg)); err != nil {
					t.Fatal(err)
				}
				if got, err := br.ReadString('\n'); err != nil || got != msg {
					t.Fatalf("%s: echo %q %v, want %q", r.name, got, err, msg)
				}
			}
		}
	})

	t.Run("NothingListens502", func(t *testing.T) {
		for _, r := range routes {
			code, body := doReq(t, r.request("GET", a.ID, 8009, "/", nil))
			wantJSONError(t, r.name, code, body, 502, "nothing listens on port 8009")
		}
	})

	t.Run("NotEnabledUnknown404", func(t *testing.T) {
		unknown := "sbx_0123456789abcdef0123456789abcdef"
		for _, r := range routes {
			code, body := doReq(t, r.request("GET", b, 8000, "/", nil))
			wantJSONError(t, r.name+" not enabled", code, body, 404, "")
			code, body = doReq(t, r.request("GET", unknown, 8000, "/", nil))
			wantJSONError(t, r.name+" unknown", code, body, 404, "")
		}
		code, body := doReq(t, routes[1].request("GET", b, 8000, "/", nil))
		wantJSONError(t, "api not enabled", code, body, 404, "without ingress_enabled")
		code, body = doReq(t, routes[1].request("GET", a.ID, 0, "/", nil))
		wantJSONError(t, "api port 0", code, body, 400, "port must be")
		// A host that names no sandbox port, and the API route without the key.
		req, _ := http.NewRequest("GET", "http://"+ingressAddr+"/", nil)
		code, body = doReq(t, req)
		wantJSONError(t, "host route, bare address", code, body, 404, "<port>-<sandbox id without sbx_>")
		req = routes[1].request("GET", a.ID, 8000, "/", nil)
		req.Header.Del("Authorization")
		code, body = doReq(t, req)
		wantJSONError(t, "api route without key", code, body, 401, "api key")
	})

	t.Run("SandboxesCannotReachEachOtherOrTheIngress", func(t *testing.T) {
		c := create(t, s, &client.CreateRequest{IngressEnabled: true})
		gw := strings.TrimSpace(sh(t, s, c, "ip -4 route show default | awk '{print $3}'").Stdout)
		probe := func(host, port string) string {
			return sh(t, s, c, fmt.Sprintf("python3 -c \"import socket\ntry:\n    s=socket.create_connection(('%s', %s), 3); s.sendall(b'GET / HTTP/1.0\\r\\nHost: 8000-%s.localhost\\r\\n\\r\\n'); print('reached', s.recv(100))\nexcept Exception as e:\n    print('blocked', type(e).__name__)\"", host, port, a.ID[4:])).Stdout
		}
		if out := probe(a.IP, "8000"); !strings.HasPrefix(out, "blocked") {
			t.Errorf("an ingress-enabled sandbox reached another's port directly: %q", out)
		}
		if out := probe(gw, u.Port()); !strings.HasPrefix(out, "blocked") {
			t.Errorf("a sandbox reached the ingress listener on the bridge address %s: %q", gw, out)
		}
		// The probes really probe: from the host, the same app answers through the ingress.
		if code, _ := doReq(t, routes[0].request("GET", a.ID, 8000, "/", nil)); code != 200 {
			t.Errorf("host route after the probes: %d", code)
		}
	})

	t.Run("CLICreateIngress", func(t *testing.T) {
		env := []string{"RAMIFY_API_URL=" + s.URL, "RAMIFY_API_KEY=" + s.Key}
		out, errOut, code := runCLI(t, testserver.Binary(t), env, "sandbox", "create", "--ingress")
		id := strings.TrimSpace(out)
		if code != 0 || !strings.Contains(errOut, "its ports:     http://{port}-"+strings.TrimPrefix(id, "sbx_")+".localhost:") {
			t.Fatalf("sandbox create --ingress: %d %q %q", code, out, errOut)
		}
		if sb, err := s.Client.Get(ctx, id); err != nil || !sb.Ingress.Enabled {
			t.Errorf("created by the CLI with --ingress: %v %+v", err, sb)
		}
		s.Client.Delete(ctx, id) //nolint:errcheck // the server's cleanup removes it otherwise
	})

	t.Run("ForkInheritsAndForkOfPausedSets", func(t *testing.T) {
		kids, err := s.Client.Fork(ctx, a.ID, 1)
		if err != nil {
			t.Fatal(err)
		}
		if k, _ := s.Client.Get(ctx, kids[0]); !k.Ingress.Enabled {
			t.Errorf("fork child of an ingress-enabled sandbox: %+v", k.Ingress)
		}
		if _, _, err := s.Client.Pause(ctx, b); err != nil {
			t.Fatal(err)
		}
		if _, err := s.Client.WaitStatus(ctx, b, client.StatusPaused); err != nil {
			t.Fatal(err)
		}
		code, body := doReq(t, routes[1].request("GET", b, 8000, "/", nil))
		wantJSONError(t, "paused", code, body, 404, "")
		var fr struct{ Children []string }
		if err := s.PostJSON(ctx, "/v1/sandboxes/"+b+"/fork", map[string]any{"ingress_enabled": true}, &fr); err != nil || len(fr.Children) != 1 {
			t.Fatalf("fork of paused with ingress_enabled: %v %+v", err, fr)
		}
		k, err := s.Client.WaitStatus(ctx, fr.Children[0], client.StatusRunning)
		if err != nil || !k.Ingress.Enabled {
			t.Fatalf("fork of paused child: %v %+v", err, k)
		}
		startIngressApp(t, s, k.ID, 8000) // only the interpreter is restored: start the app again
		code, body = doReq(t, routes[0].request("POST", k.ID, 8000, "/x", bytes.NewReader([]byte("hi"))))
		if code != 200 || !strings.Contains(string(body), `"body": "hi"`) {
			t.Errorf("fork of paused child through the ingress: %d %s", code, body)
		}
	})
}
