package api

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/ramify-dev/ramify/internal/errdefs"
	"github.com/ramify-dev/ramify/internal/sandbox"
)

// Bounds of the ingress proxy. Bodies are not bounded: a response may stream for as long as both ends want, and
// an upgraded (WebSocket) connection lives until one end closes it.
const (
	// IngressDialTimeout bounds the connection to the sandbox's port (on the local bridge: an answer or a reset
	// comes at once unless the sandbox is stalled).
	IngressDialTimeout = 10 * time.Second
	// IngressHeaderTimeout bounds the wait for the sandbox's response headers once the request is sent.
	IngressHeaderTimeout = 2 * time.Minute
)

// ingressMethods are the methods the API's ports route forwards (HEAD goes with GET).
var ingressMethods = []string{"GET", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"}

func (s *Server) ingressRoutes() {
	h := s.auth(s.ports)
	for _, m := range ingressMethods {
		s.handle(m+" /v1/sandboxes/{id}/ports/{port}/{path...}", h)
	}
}

// ingressProxy forwards requests to sandboxes' ports: HTTP/1.1, streamed both ways, Upgrade (WebSocket) included.
var ingressProxy = &httputil.ReverseProxy{
	Rewrite: func(pr *httputil.ProxyRequest) {
		t := pr.In.Context().Value(ingressTargetKey{}).(ingressTarget)
		pr.SetURL(&url.URL{Scheme: "http", Host: t.addr})
		pr.Out.URL.Path, pr.Out.URL.RawPath = t.path, t.rawPath
		pr.Out.URL.RawQuery = pr.In.URL.RawQuery
		pr.SetXForwarded()
		if t.keepHost {
			pr.Out.Host = pr.In.Host
		}
		for _, h := range t.drop {
			pr.Out.Header.Del(h)
		}
		if pr.Out.Body != nil && pr.Out.ContentLength > 0 {
			pr.Out.Body = exactBody{io.LimitReader(pr.Out.Body, pr.Out.ContentLength), pr.Out.Body}
		}
	},
	Transport: &http.Transport{
		Proxy:                 nil, // never an environment proxy: the sandbox is on the local bridge
		DialContext:           (&net.Dialer{Timeout: IngressDialTimeout}).DialContext,
		ResponseHeaderTimeout: IngressHeaderTimeout,
		// A connection per request: a pooled one would outlive a deleted sandbox and fail (502) the next request
		// to a sandbox that got its address. Connecting on the local bridge costs little.
		DisableKeepAlives: true,
	},
	FlushInterval: -1, // stream: every write of the sandbox's server is passed on at once
	ErrorHandler:  ingressError,
}

// exactBody is a request body of known length that never reads its source past that length. The transport reads
// once more after the declared length, to check there is no more; by then the app may have answered, and writing
// its response headers makes the server close the inbound body, so that read would fail and tear down the
// connection under the response being relayed (golang/go#40747).
type exactBody struct {
	io.Reader
	io.Closer
}

type ingressTargetKey struct{}

// ingressTarget is where one proxied request goes.
type ingressTarget struct {
	id, addr, port string
	path, rawPath  string
	keepHost       bool     // the Host route keeps the client's Host; the API route sends the sandbox's address
	drop           []string // request headers not to forward (the API key's)
}

// ingressError answers a request the sandbox's port did not: 502, or 504 when its headers did not come in time.
func ingressError(w http.ResponseWriter, r *http.Request, err error) {
	t := r.Context().Value(ingressTargetKey{}).(ingressTarget)
	code, msg := http.StatusBadGateway, fmt.Sprintf("port %s of sandbox %s: %v", t.port, t.id, err)
	var ne net.Error
	switch {
	case errors.Is(err, syscall.ECONNREFUSED):
		msg = fmt.Sprintf("nothing listens on port %s in sandbox %s (connection refused)", t.port, t.id)
	case errors.Is(err, context.Canceled):
		return // the client went away
	case errors.As(err, &ne) && ne.Timeout():
		code = http.StatusGatewayTimeout
	}
	writeJSON(w, code, map[string]string{"error": msg})
}

// proxyTo sends r to t (the proxy's Rewrite and ErrorHandler read t from the context).
func proxyTo(w http.ResponseWriter, r *http.Request, t ingressTarget) {
	ingressProxy.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), ingressTargetKey{}, t)))
}

// ports is the API's route to a sandbox's port: /v1/sandboxes/{id}/ports/{port}/{path...}, any method, the path
// and query forwarded, the API key not.
func (s *Server) ports(w http.ResponseWriter, r *http.Request) {
	id, ps := r.PathValue("id"), r.PathValue("port")
	port, err := strconv.Atoi(ps)
	if err != nil || port < 1 || port > 65535 || strconv.Itoa(port) != ps {
		writeError(w, errdefs.New(errdefs.ErrInvalid, fmt.Sprintf("port must be a number between 1 and 65535, not %q", ps)))
		return
	}
	ip, err := s.svc.IngressAddr(id)
	if err != nil {
		writeError(w, err)
		return
	}
	t := ingressTarget{id: id, port: ps, addr: net.JoinHostPort(ip, ps)}
	prefix := "/v1/sandboxes/" + id + "/ports/" + ps
	// The rest of the path as the client escaped it (so that %2F stays %2F); the unescaped form when the client
	// escaped the prefix itself.
	rest, ok := strings.CutPrefix(r.URL.EscapedPath(), prefix)
	if t.path, err = url.PathUnescape(rest); !ok || err != nil || !strings.HasPrefix(rest, "/") {
		t.path, rest = "/"+r.PathValue("path"), ""
	}
	t.rawPath = rest
	// The key is the server's, not the sandbox's: drop the header that carried it.
	if strings.HasPrefix(r.Header.Get("Authorization"), "Bearer ") {
		t.drop = []string{"Authorization"}
	} else {
		t.drop = []string{"X-Api-Key"}
	}
	proxyTo(w, r, t)
}

// IngressHandler serves the ingress listener: a request whose Host is "<port>-<id without sbx_>.<domain>" goes to
// that port of that sandbox, when it runs with ingress enabled; any other is a JSON 404. No API key: the URL is
// the capability (a sandbox id is 128 random bits), as with the hosted products' public sandbox URLs.
func (s *Server) IngressHandler(domain string) http.Handler {
	suffix := "." + strings.ToLower(strings.TrimSuffix(domain, "."))
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		host := strings.ToLower(r.Host)
		if h, _, err := net.SplitHostPort(host); err == nil {
			host = h
		}
		label, ok := strings.CutSuffix(strings.TrimSuffix(host, "."), suffix)
		id, port, ok2 := sandbox.ParseIngressLabel(label)
		if !ok || !ok2 {
			writeJSON(w, http.StatusNotFound, map[string]string{"error": fmt.Sprintf(
				"no sandbox port is named by host %q: use <port>-<sandbox id without sbx_>%s", r.Host, suffix)})
			return
		}
		ip, err := s.svc.IngressAddr(id)
		if err != nil {
			// One answer for unknown, not enabled and not running: the unauthenticated side learns nothing more.
			writeJSON(w, http.StatusNotFound, map[string]string{"error": fmt.Sprintf(
				"no running sandbox %s with ingress enabled", id)})
			return
		}
		ps := strconv.Itoa(port)
		proxyTo(w, r, ingressTarget{id: id, port: ps, addr: net.JoinHostPort(ip, ps), keepHost: true,
			path: r.URL.Path, rawPath: r.URL.RawPath})
	})
}
