package client

import (
	"context"
	"net/http"
	"net/url"
)

// Create creates a sandbox; the zero CreateRequest takes every default.
func (c *Client) Create(ctx context.Context, req CreateRequest) (*Sandbox, error) {
	var sb Sandbox
	if _, err := c.do(ctx, request{method: http.MethodPost, path: "/v1/sandboxes", json: req}, &sb); err != nil {
		return nil, err
	}
	return &sb, nil
}

// Get returns one sandbox.
func (c *Client) Get(ctx context.Context, id string) (*Sandbox, error) {
	sb, _, err := c.get(ctx, id)
	return sb, err
}

// get returns a sandbox and the X-Poll-After hint of the response.
func (c *Client) get(ctx context.Context, id string) (*Sandbox, http.Header, error) {
	var sb Sandbox
	h, err := c.do(ctx, request{method: http.MethodGet, path: sandboxPath(id, "")}, &sb)
	if err != nil {
		return nil, nil, err
	}
	return &sb, h, nil
}

// List returns the sandboxes matching opts.
func (c *Client) List(ctx context.Context, opts ListOptions) ([]Sandbox, error) {
	q := url.Values{}
	if opts.Status != "" {
		q.Set("status", opts.Status)
	}
	for k, v := range opts.Metadata {
		q.Set("metadata."+k, v)
	}
	var out struct {
		Sandboxes []Sandbox `json:"sandboxes"`
	}
	if _, err := c.do(ctx, request{method: http.MethodGet, path: "/v1/sandboxes", query: q}, &out); err != nil {
		return nil, err
	}
	if out.Sandboxes == nil {
		out.Sandboxes = []Sandbox{}
	}
	return out.Sandboxes, nil
}

// SetTimeout is keepalive: the sandbox now times out timeoutS seconds from now (0: never), with its on_timeout
// action. It works on running and paused sandboxes and returns the sandbox with its new ExpiresAt.
func (c *Client) SetTimeout(ctx context.Context, id string, timeoutS int) (*Sandbox, error) {
	body := struct {
		TimeoutS int `json:"timeout_s"`
	}{timeoutS}
	var out Sandbox
	if _, err := c.do(ctx, request{method: http.MethodPost, path: sandboxPath(id, "/timeout"), json: body}, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// AddSSHKeys authorizes more SSH keys (authorized_keys lines) on a running or paused sandbox; keys it already
// has are skipped. It returns the sandbox, whose SSH field lists the keys.
func (c *Client) AddSSHKeys(ctx context.Context, id string, keys []string) (*Sandbox, error) {
	body := struct {
		Keys []string `json:"keys"`
	}{keys}
	var out Sandbox
	if _, err := c.do(ctx, request{method: http.MethodPost, path: sandboxPath(id, "/ssh_keys"), json: body}, &out); err != nil {
		return nil, err
	}
	return &out, nil
}

// Delete destroys a sandbox: its processes are killed and its file system removed. Deleting an unknown
// sandbox (including a second delete) is ErrNotFound.
func (c *Client) Delete(ctx context.Context, id string) error {
	_, err := c.do(ctx, request{method: http.MethodDelete, path: sandboxPath(id, "")}, nil)
	return err
}

// Health calls GET /healthz (which needs no API key).
func (c *Client) Health(ctx context.Context) (*HealthStatus, error) {
	var h HealthStatus
	if _, err := c.do(ctx, request{method: http.MethodGet, path: "/healthz"}, &h); err != nil {
		return nil, err
	}
	return &h, nil
}
