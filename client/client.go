// Package client is the Go client of the ramify REST API (docs/api.md): sandboxes, code and command
// execution (plain and streamed), files and archives, fork / merge_into / diff, and pause / resume.
//
// Every method takes a context first; cancelling it aborts the request, including a stream in progress.
// Errors returned by the server are *APIError values that match the package's sentinels with errors.Is:
//
//	_, err := c.Get(ctx, id)
//	if errors.Is(err, client.ErrNotFound) { ... }
package client

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"
)

// DefaultURL is the server address used when RAMIFY_API_URL is not set.
const DefaultURL = "http://127.0.0.1:7070"

// Client talks to one ramify server. It is safe for concurrent use.
type Client struct {
	base   string
	apiKey string
	hc     *http.Client
	ua     string
}

// Option configures a Client.
type Option func(*Client)

// WithHTTPClient makes the client send its requests through hc (timeouts, transports, proxies). Note that a
// client-wide hc.Timeout also bounds streams and file transfers; prefer contexts for per-call limits.
func WithHTTPClient(hc *http.Client) Option {
	return func(c *Client) {
		if hc != nil {
			c.hc = hc
		}
	}
}

// WithUserAgent sets the User-Agent header of every request.
func WithUserAgent(ua string) Option { return func(c *Client) { c.ua = ua } }

// defaultHTTP is the HTTP client of every Client made without WithHTTPClient. It keeps up to 64 idle
// connections per server (net/http's default keeps 2): a fork's children are called concurrently, and with 2
// kept the rest of each round's connections were closed and opened again for the next call.
var defaultHTTP = &http.Client{Transport: func() http.RoundTripper {
	t := http.DefaultTransport.(*http.Transport).Clone()
	t.MaxIdleConnsPerHost = 64
	return t
}()}

// New returns a client of the server at baseURL (e.g. "http://127.0.0.1:7070") authenticating with apiKey.
func New(baseURL, apiKey string, opts ...Option) *Client {
	c := &Client{
		base:   strings.TrimRight(baseURL, "/"),
		apiKey: apiKey,
		hc:     defaultHTTP,
		ua:     "ramify-go-client",
	}
	for _, o := range opts {
		o(c)
	}
	return c
}

// FromEnv returns a client configured from RAMIFY_API_URL (default DefaultURL) and RAMIFY_API_KEY. A URL
// without a scheme ("127.0.0.1:7070", "localhost:7070") is taken as http://. It fails only when the URL is
// malformed; a missing key is reported by the server as 401.
func FromEnv(opts ...Option) (*Client, error) {
	base, err := ParseURL(os.Getenv("RAMIFY_API_URL"))
	if err != nil {
		return nil, err
	}
	return New(base, os.Getenv("RAMIFY_API_KEY"), opts...), nil
}

// ParseURL checks a server address as RAMIFY_API_URL gives it and returns it normalised: empty is DefaultURL,
// and an address without a scheme gets http://.
func ParseURL(raw string) (string, error) {
	base := strings.TrimSpace(raw)
	if base == "" {
		return DefaultURL, nil
	}
	if !strings.Contains(base, "://") {
		base = "http://" + base
	}
	u, err := url.Parse(base)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return "", fmt.Errorf("RAMIFY_API_URL %q: want http(s)://host[:port], e.g. http://127.0.0.1:7070", raw)
	}
	return strings.TrimRight(base, "/"), nil
}

// BaseURL returns the server address the client talks to.
func (c *Client) BaseURL() string { return c.base }

// HasAPIKey reports whether the client was given a non-empty API key.
func (c *Client) HasAPIKey() bool { return c.apiKey != "" }

// sandboxPath returns "/v1/sandboxes/{id}" followed by the given suffix (which starts with "/" or is empty).
func sandboxPath(id, suffix string) string {
	return "/v1/sandboxes/" + url.PathEscape(id) + suffix
}

// request is one HTTP call to the API.
type request struct {
	method string
	path   string
	query  url.Values
	// Exactly one of json and body may be set.
	json   any
	body   io.Reader
	ctype  string
	accept string
}

// send performs r and returns the response when its status is 2xx; otherwise it reads the error body, closes
// the response and returns an *APIError. The caller closes the returned body.
func (c *Client) send(ctx context.Context, r request) (*http.Response, error) {
	u := c.base + r.path
	if len(r.query) > 0 {
		u += "?" + r.query.Encode()
	}
	var payload []byte // a body that can be sent again
	ctype := r.ctype
	if r.json != nil {
		b, err := json.Marshal(r.json)
		if err != nil {
			return nil, fmt.Errorf("encode request: %w", err)
		}
		payload, ctype = b, "application/json"
	}
	// A POST carries an idempotency key: the server does it at most once and answers a repeat with the first
	// call's answer, so a call whose connection broke is sent again without forking (creating, merging) twice.
	// So are GETs and DELETEs; a streamed body cannot be sent again.
	idemKey := ""
	if r.method == http.MethodPost && r.body == nil {
		idemKey = newIdempotencyKey()
	}
	tries := 1
	if r.body == nil && (idemKey != "" || r.method == http.MethodGet || r.method == http.MethodDelete) {
		tries = RetryTries
	}
	var resp *http.Response
	for attempt := 0; ; attempt++ {
		var body io.Reader
		switch {
		case r.json != nil:
			body = bytes.NewReader(payload)
		case r.body != nil:
			// Hide any Close method: the transport closes request bodies, and the reader belongs to the caller.
			body = struct{ io.Reader }{r.body}
		}
		req, err := http.NewRequestWithContext(ctx, r.method, u, body)
		if err != nil {
			return nil, err
		}
		c.setHeaders(req, r, ctype, idemKey)
		resp, err = c.hc.Do(req)
		if err == nil {
			break
		}
		if attempt+1 >= tries || ctx.Err() != nil {
			return nil, err
		}
		select {
		case <-time.After(RetryBaseDelay << attempt):
		case <-ctx.Done():
			return nil, err
		}
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		defer resp.Body.Close()
		return nil, readAPIError(resp)
	}
	return resp, nil
}

// RetryTries is how many times a request that is safe to send again (a GET, a DELETE, or a POST, which carries
// an Idempotency-Key) is tried when it fails without an answer (the connection refused or broken); the waits
// between tries start at RetryBaseDelay and double.
var (
	RetryTries     = 4
	RetryBaseDelay = 200 * time.Millisecond
)

// newIdempotencyKey is a random key for one call.
func newIdempotencyKey() string {
	var b [16]byte
	rand.Read(b[:]) //nolint:errcheck // never fails (crypto/rand)
	return hex.EncodeToString(b[:])
}

// setHeaders sets r's headers on req.
func (c *Client) setHeaders(req *http.Request, r request, ctype, idemKey string) {
	if idemKey != "" {
		req.Header.Set("Idempotency-Key", idemKey)
	}
	if ctype != "" {
		req.Header.Set("Content-Type", ctype)
	}
	if r.accept != "" {
		req.Header.Set("Accept", r.accept)
	} else {
		req.Header.Set("Accept", "application/json")
	}
	if c.apiKey != "" {
		req.Header.Set("Authorization", "Bearer "+c.apiKey)
	}
	if c.ua != "" {
		req.Header.Set("User-Agent", c.ua)
	}
}

// do performs r and decodes a JSON response into out (when out is non-nil and the response has a body).
// It returns the response headers.
func (c *Client) do(ctx context.Context, r request, out any) (http.Header, error) {
	resp, err := c.send(ctx, r)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if out != nil && resp.StatusCode != http.StatusNoContent {
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			return resp.Header, fmt.Errorf("%s %s: read response: %w", r.method, r.path, err)
		}
		if len(bytes.TrimSpace(b)) > 0 {
			if err := json.Unmarshal(b, out); err != nil {
				return resp.Header, fmt.Errorf("%s %s: decode response: %w", r.method, r.path, err)
			}
		}
	} else {
		// Drain a little so the connection can be reused.
		_, _ = io.CopyN(io.Discard, resp.Body, 64<<10)
	}
	return resp.Header, nil
}

// pollAfter parses an X-Poll-After header: seconds as an integer or decimal ("2", "0.5"), or a Go duration
// ("500ms"). It returns 0 when the header is absent or malformed.
func pollAfter(h http.Header) time.Duration {
	v := strings.TrimSpace(h.Get("X-Poll-After"))
	if v == "" {
		return 0
	}
	if f, err := strconv.ParseFloat(v, 64); err == nil {
		if f < 0 {
			return 0
		}
		return time.Duration(f * float64(time.Second))
	}
	if d, err := time.ParseDuration(v); err == nil && d > 0 {
		return d
	}
	return 0
}

// Int returns a pointer to n, for optional fields such as RunCodeRequest.TimeoutS (where 0 means "no limit"
// and nil means "the server's default").
func Int(n int) *int { return &n }
