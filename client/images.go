package client

import (
	"context"
	"net/http"
	"net/url"
	"time"
)

// Image is an image sandboxes run on: the default one, or a named one built on top of it.
type Image struct {
	Name      string    `json:"name"`
	ID        string    `json:"id"`
	Default   bool      `json:"default"`
	BaseID    string    `json:"base_id,omitempty"` // a named image: the default image it was built on
	Apt       []string  `json:"apt"`
	Pip       []string  `json:"pip"`
	PipIndex  string    `json:"pip_index,omitempty"`
	BuiltAt   time.Time `json:"built_at"`
	SizeBytes int64     `json:"size_bytes"`
	Sandboxes int       `json:"sandboxes"` // sandboxes (any status) on it
	Templates int       `json:"templates"` // templates on it
	Error     string    `json:"error,omitempty"`
}

// BuildImageRequest says what a named image holds on top of the default image.
type BuildImageRequest struct {
	Name     string   `json:"name"`
	Apt      []string `json:"apt,omitempty"`       // Debian packages
	Pip      []string `json:"pip,omitempty"`       // pip requirements, installed from PipIndex
	PipIndex string   `json:"pip_index,omitempty"` // a PEP 503 simple index the server reaches
}

// BuildImage builds (or rebuilds) a named image on the server, calling progress (which may be nil) with each
// progress line, and returns it when done. Cancelling ctx cancels the build. ErrConflict when sandboxes or
// templates use the name.
func (c *Client) BuildImage(ctx context.Context, req BuildImageRequest, progress func(line string)) (*Image, error) {
	var out struct {
		Image Image `json:"image"`
	}
	err := c.stream(ctx, "/v1/images", req, "done", func(ev Event) {
		if ev.Type == "progress" && progress != nil {
			progress(ev.Data)
		}
	}, &out, func() {}) // the server always streams when asked to
	if err != nil {
		return nil, err
	}
	return &out.Image, nil
}

// Images lists the default image and the named ones.
func (c *Client) Images(ctx context.Context) ([]Image, error) {
	var out struct {
		Images []Image `json:"images"`
	}
	if _, err := c.do(ctx, request{method: http.MethodGet, path: "/v1/images"}, &out); err != nil {
		return nil, err
	}
	return out.Images, nil
}

// GetImage returns one image ("default" for the default one); ErrNotFound when there is none of that name.
func (c *Client) GetImage(ctx context.Context, name string) (*Image, error) {
	var img Image
	if _, err := c.do(ctx, request{method: http.MethodGet, path: "/v1/images/" + url.PathEscape(name)}, &img); err != nil {
		return nil, err
	}
	return &img, nil
}

// DeleteImage removes a named image; ErrConflict while sandboxes or templates use it.
func (c *Client) DeleteImage(ctx context.Context, name string) error {
	_, err := c.do(ctx, request{method: http.MethodDelete, path: "/v1/images/" + url.PathEscape(name)}, nil)
	return err
}
