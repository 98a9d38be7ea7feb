package client

import (
	"context"
	"net/http"
	"net/url"
	"time"
)

// Template is a named capture of a sandbox: its files and its interpreter's session. Create sandboxes from it
// with CreateRequest.Template.
type Template struct {
	Name      string    `json:"name"`
	From      string    `json:"from"`
	CreatedAt time.Time `json:"created_at"`
	// Size is the snapshot's size in bytes.
	Size int64 `json:"size"`
	// NotSaved lists the variables the capture could not save.
	NotSaved  []Skipped `json:"not_saved"`
	CaptureMs float64   `json:"capture_ms"`
	// Spec is what sandboxes created from it get unless their create request sets a field.
	Spec map[string]any `json:"spec"`
}

// SaveTemplate captures running sandbox from under name (1 to 63 characters of a-z, 0-9, '-', '_', '.',
// starting with a letter or digit); the sandbox keeps running. ErrConflict when the name is taken.
func (c *Client) SaveTemplate(ctx context.Context, name, from string) (*Template, error) {
	var t Template
	body := map[string]string{"name": name, "from": from}
	if _, err := c.do(ctx, request{method: http.MethodPost, path: "/v1/templates", json: body}, &t); err != nil {
		return nil, err
	}
	return &t, nil
}

// Templates lists the templates, by name.
func (c *Client) Templates(ctx context.Context) ([]Template, error) {
	var out struct {
		Templates []Template `json:"templates"`
	}
	if _, err := c.do(ctx, request{method: http.MethodGet, path: "/v1/templates"}, &out); err != nil {
		return nil, err
	}
	return out.Templates, nil
}

// GetTemplate returns one template; ErrNotFound when there is none of that name.
func (c *Client) GetTemplate(ctx context.Context, name string) (*Template, error) {
	var t Template
	if _, err := c.do(ctx, request{method: http.MethodGet, path: "/v1/templates/" + url.PathEscape(name)}, &t); err != nil {
		return nil, err
	}
	return &t, nil
}

// DeleteTemplate removes a template; sandboxes created from it are not affected.
func (c *Client) DeleteTemplate(ctx context.Context, name string) error {
	_, err := c.do(ctx, request{method: http.MethodDelete, path: "/v1/templates/" + url.PathEscape(name)}, nil)
	return err
}
