package client

import (
	"context"
	"fmt"
	"io"
	"io/fs"
	"net/http"

	"github.com/ramify-dev/ramify/internal/rawname"
)

// ReadFile opens a file of the sandbox for reading; the content is streamed from the server. The caller closes
// the reader. A missing file is ErrNotFound, a directory ErrInvalid.
func (c *Client) ReadFile(ctx context.Context, id, path string) (io.ReadCloser, error) {
	resp, err := c.send(ctx, request{method: http.MethodGet, path: sandboxPath(id, "/files"), query: pathQuery(path), accept: "application/octet-stream"})
	if err != nil {
		return nil, err
	}
	return resp.Body, nil
}

// WriteFile writes r to a file of the sandbox, creating parent directories, and returns the size written. The
// content is streamed (sent chunked as it is read, never held in memory). mode 0 leaves the server's default;
// otherwise its permission bits are sent. r is read until EOF; it is not closed.
func (c *Client) WriteFile(ctx context.Context, id, path string, r io.Reader, mode fs.FileMode) (int64, error) {
	q := pathQuery(path)
	if mode != 0 {
		q.Set("mode", fmt.Sprintf("%04o", mode.Perm()))
	}
	var out struct {
		Path string `json:"path"`
		Size int64  `json:"size"`
	}
	_, err := c.do(ctx, request{method: http.MethodPut, path: sandboxPath(id, "/files"), query: q, body: r, ctype: "application/octet-stream"}, &out)
	return out.Size, err
}

// ListFiles lists a directory of the sandbox, sorted by name.
func (c *Client) ListFiles(ctx context.Context, id, path string) ([]Entry, error) {
	var out struct {
		Entries []Entry `json:"entries"`
	}
	if _, err := c.do(ctx, request{method: http.MethodGet, path: sandboxPath(id, "/files/list"), query: pathQuery(path)}, &out); err != nil {
		return nil, err
	}
	if out.Entries == nil {
		out.Entries = []Entry{}
	}
	return out.Entries, nil
}

// Stat describes one path of the sandbox (ErrNotFound if it does not exist).
func (c *Client) Stat(ctx context.Context, id, path string) (*Entry, error) {
	var e Entry
	if _, err := c.do(ctx, request{method: http.MethodGet, path: sandboxPath(id, "/files/stat"), query: pathQuery(path)}, &e); err != nil {
		return nil, err
	}
	return &e, nil
}

// Mkdir creates a directory of the sandbox (and its parents when parents is true).
func (c *Client) Mkdir(ctx context.Context, id, path string, parents bool) (*Entry, error) {
	body := struct {
		Path    string `json:"path,omitempty"`
		PathB64 string `json:"path_b64,omitempty"`
		Parents bool   `json:"parents"`
	}{Path: path, Parents: parents}
	if _, b := rawname.Encode(path); b != "" {
		body.Path, body.PathB64 = "", b
	}
	var e Entry
	if _, err := c.do(ctx, request{method: http.MethodPost, path: sandboxPath(id, "/files/mkdir"), json: body}, &e); err != nil {
		return nil, err
	}
	return &e, nil
}

// RemoveFile deletes a path of the sandbox; a non-empty directory needs recursive.
func (c *Client) RemoveFile(ctx context.Context, id, path string, recursive bool) error {
	q := pathQuery(path)
	if recursive {
		q.Set("recursive", "true")
	}
	_, err := c.do(ctx, request{method: http.MethodDelete, path: sandboxPath(id, "/files"), query: q}, nil)
	return err
}

// DownloadArchive returns a tar stream of the contents of a directory of the sandbox. The caller closes it.
func (c *Client) DownloadArchive(ctx context.Context, id, dir string) (io.ReadCloser, error) {
	resp, err := c.send(ctx, request{method: http.MethodGet, path: sandboxPath(id, "/files/archive"), query: pathQuery(dir), accept: "application/x-tar"})
	if err != nil {
		return nil, err
	}
	return resp.Body, nil
}

// UploadArchive extracts the tar stream r under a directory of the sandbox and returns the number of files
// extracted. The stream is sent as it is read. r is not closed.
func (c *Client) UploadArchive(ctx context.Context, id, dir string, r io.Reader) (int, error) {
	var out struct {
		Path  string `json:"path"`
		Files int    `json:"files"`
	}
	_, err := c.do(ctx, request{method: http.MethodPut, path: sandboxPath(id, "/files/archive"), query: pathQuery(dir), body: r, ctype: "application/x-tar"}, &out)
	return out.Files, err
}
