package api

import (
	"errors"
	"io"
	"net/http"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/ramify-dev/ramify/internal/errdefs"
	"github.com/ramify-dev/ramify/internal/files"
	"github.com/ramify-dev/ramify/internal/rawname"
)

// withFS resolves the path query parameter and opens the sandbox's file system for the duration of fn, which
// writes its response through the w it is given. A transfer that makes no progress for the body idle timeout
// ends (an upload that stops coming, a download the client stops reading), and a delete of the sandbox ends it
// at once: neither holds the sandbox back.
func (s *Server) withFS(w http.ResponseWriter, r *http.Request, fn func(fs *files.FS, w http.ResponseWriter, p string) error) {
	p, err := queryPath(r)
	if err != nil {
		writeError(w, err)
		return
	}
	s.withFSPath(w, r, p, fn)
}

// queryPath is the path a files request names in its query: path (whose percent-encoding may carry any bytes)
// or path_b64 (standard base64 of the raw bytes), exactly one of them.
func queryPath(r *http.Request) (string, error) {
	q := r.URL.Query()
	_, hasPlain := q["path"]
	_, hasB64 := q["path_b64"]
	raw, _, err := files.PathParam("path", q.Get("path"), hasPlain, q.Get("path_b64"), hasB64)
	if err != nil {
		return "", err
	}
	return raw, nil
}

// withFSPath is withFS for the raw path p (not yet cleaned), given by the caller.
func (s *Server) withFSPath(w http.ResponseWriter, r *http.Request, p string, fn func(fs *files.FS, w http.ResponseWriter, p string) error) {
	p, err := files.CleanPath(p)
	if err != nil {
		writeError(w, err)
		return
	}
	fc, err := s.svc.Files(r.Context(), r.PathValue("id"))
	if err != nil {
		writeError(w, err)
		return
	}
	defer fc.Release()
	tw := &transferWriter{ResponseWriter: w, rc: http.NewResponseController(w), idle: s.bodyIdle}
	defer tw.done()
	body, _ := r.Body.(*progressBody)
	fc.OnStop(func() {
		if body != nil {
			body.stop()
		}
		tw.stop()
	})
	if err := fn(fc.FS, tw, p); err != nil {
		writeError(w, fc.Err(err))
	}
}

// transferWriter writes a files response: it moves the connection's write deadline forward at every write, so
// that a client that stops reading a download is cut off after the idle timeout rather than holding its
// sandbox for ever, and clears it when the handler is done (net/http sets none of its own, so a deadline left
// set would cut a later response on the same connection). stop ends a transfer under way at once.
type transferWriter struct {
	http.ResponseWriter
	rc   *http.ResponseController
	idle time.Duration

	mu      sync.Mutex
	started bool // the response's body has begun
	stopped bool
}

func (t *transferWriter) Write(p []byte) (int, error) {
	t.mu.Lock()
	if t.stopped {
		t.mu.Unlock()
		return 0, errTransferStopped
	}
	t.started = true
	t.rc.SetWriteDeadline(time.Now().Add(t.idle)) //nolint:errcheck // a connection without deadlines is not cut
	t.mu.Unlock()
	return t.ResponseWriter.Write(p)
}

// stop ends the response's transfer: a write under way fails at once, later ones at their start. A response
// not begun is left alone: its handler's error answer still goes out.
func (t *transferWriter) stop() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.stopped = true
	if t.started {
		t.rc.SetWriteDeadline(time.Unix(1, 0)) //nolint:errcheck // as in Write
	}
}

func (t *transferWriter) done() {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.started && !t.stopped {
		t.rc.SetWriteDeadline(time.Time{}) //nolint:errcheck // as in Write
	}
}

func (t *transferWriter) Unwrap() http.ResponseWriter { return t.ResponseWriter }

var errTransferStopped = errors.New("transfer stopped")

func (s *Server) readFile(w http.ResponseWriter, r *http.Request) {
	s.withFS(w, r, func(fs *files.FS, w http.ResponseWriter, p string) error {
		f, e, err := fs.OpenRead(p)
		if err != nil {
			return err
		}
		defer f.Close()
		w.Header().Set("Content-Type", "application/octet-stream")
		w.Header().Set("Content-Length", strconv.FormatInt(e.Size, 10))
		w.WriteHeader(200)
		io.Copy(w, f) //nolint:errcheck // the client went away
		return nil
	})
}

func (s *Server) writeFile(w http.ResponseWriter, r *http.Request) {
	mode := os.FileMode(0o644)
	if m := r.URL.Query().Get("mode"); m != "" {
		v, err := strconv.ParseUint(m, 8, 32)
		if err != nil || v > 0o7777 {
			writeError(w, errdefs.New(errdefs.ErrInvalid, "mode must be octal, e.g. 0644"))
			return
		}
		mode = os.FileMode(v&0o777) | unixSpecial(v)
	}
	s.withFS(w, r, func(fs *files.FS, w http.ResponseWriter, p string) error {
		n, err := fs.Write(p, r.Body, mode)
		if err != nil {
			return err
		}
		writeJSON(w, 200, withPath(map[string]any{"size": n}, p))
		return nil
	})
}

func unixSpecial(v uint64) os.FileMode {
	var m os.FileMode
	if v&0o4000 != 0 {
		m |= os.ModeSetuid
	}
	if v&0o2000 != 0 {
		m |= os.ModeSetgid
	}
	if v&0o1000 != 0 {
		m |= os.ModeSticky
	}
	return m
}

func (s *Server) removeFile(w http.ResponseWriter, r *http.Request) {
	recursive := r.URL.Query().Get("recursive") == "true"
	s.withFS(w, r, func(fs *files.FS, w http.ResponseWriter, p string) error {
		if err := fs.Remove(p, recursive); err != nil {
			return err
		}
		w.WriteHeader(http.StatusNoContent)
		return nil
	})
}

func (s *Server) listFiles(w http.ResponseWriter, r *http.Request) {
	s.withFS(w, r, func(fs *files.FS, w http.ResponseWriter, p string) error {
		entries, err := fs.List(p)
		if err != nil {
			return err
		}
		if entries == nil {
			entries = []files.Entry{}
		}
		writeJSON(w, 200, map[string]any{"entries": entries})
		return nil
	})
}

func (s *Server) statFile(w http.ResponseWriter, r *http.Request) {
	s.withFS(w, r, func(fs *files.FS, w http.ResponseWriter, p string) error {
		e, err := fs.Stat(p)
		if err != nil {
			return err
		}
		writeJSON(w, 200, e)
		return nil
	})
}

func (s *Server) mkdir(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Path    *string `json:"path"`
		PathB64 *string `json:"path_b64"`
		Parents *bool   `json:"parents"`
	}
	if err := decode(w, r, &req, false); err != nil {
		writeError(w, err)
		return
	}
	p, _, err := files.PathParam("path", deref(req.Path), req.Path != nil, deref(req.PathB64), req.PathB64 != nil)
	if err != nil {
		writeError(w, err)
		return
	}
	parents := req.Parents == nil || *req.Parents
	s.withFSPath(w, r, p, func(fs *files.FS, w http.ResponseWriter, p string) error {
		e, err := fs.Mkdir(p, parents)
		if err != nil {
			return err
		}
		writeJSON(w, 200, e)
		return nil
	})
}

func (s *Server) downloadArchive(w http.ResponseWriter, r *http.Request) {
	s.withFS(w, r, func(fs *files.FS, w http.ResponseWriter, p string) error {
		// Opened before the 200 goes out: a refusal (/proc, not a directory, missing) is still an error response.
		a, err := fs.OpenArchive(p)
		if err != nil {
			return err
		}
		defer a.Close()
		w.Header().Set("Content-Type", "application/x-tar")
		w.WriteHeader(200)
		a.Write(w) //nolint:errcheck // headers are sent; a broken stream is all the client can get
		return nil
	})
}

func (s *Server) uploadArchive(w http.ResponseWriter, r *http.Request) {
	s.withFS(w, r, func(fs *files.FS, w http.ResponseWriter, p string) error {
		n, err := fs.ExtractTar(p, r.Body)
		if err != nil {
			return err
		}
		writeJSON(w, 200, withPath(map[string]any{"files": n}, p))
		return nil
	})
}

// withPath adds the field "path" to m, with "path_b64" beside it when p is not valid UTF-8 (rawname.Encode).
func withPath(m map[string]any, p string) map[string]any {
	d, b := rawname.Encode(p)
	m["path"] = d
	if b != "" {
		m["path_b64"] = b
	}
	return m
}

func deref(p *string) string {
	if p == nil {
		return ""
	}
	return *p
}
