package api

import (
	"io"
	"net/http"
	"os"
	"strconv"

	"github.com/ramify-dev/ramify/internal/errdefs"
	"github.com/ramify-dev/ramify/internal/files"
)

// withFS resolves the path query parameter and opens the sandbox's file system for the duration of fn.
func (s *Server) withFS(w http.ResponseWriter, r *http.Request, fn func(fs *files.FS, p string) error) {
	p, err := files.CleanPath(r.URL.Query().Get("path"))
	if err != nil {
		writeError(w, err)
		return
	}
	fs, release, err := s.svc.Files(r.Context(), r.PathValue("id"))
	if err != nil {
		writeError(w, err)
		return
	}
	defer release()
	if err := fn(fs, p); err != nil {
		writeError(w, err)
	}
}

func (s *Server) readFile(w http.ResponseWriter, r *http.Request) {
	s.withFS(w, r, func(fs *files.FS, p string) error {
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
	s.withFS(w, r, func(fs *files.FS, p string) error {
		n, err := fs.Write(p, r.Body, mode)
		if err != nil {
			return err
		}
		writeJSON(w, 200, map[string]any{"path": p, "size": n})
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
	s.withFS(w, r, func(fs *files.FS, p string) error {
		if err := fs.Remove(p, recursive); err != nil {
			return err
		}
		w.WriteHeader(http.StatusNoContent)
		return nil
	})
}

func (s *Server) listFiles(w http.ResponseWriter, r *http.Request) {
	s.withFS(w, r, func(fs *files.FS, p string) error {
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
	s.withFS(w, r, func(fs *files.FS, p string) error {
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
		Path    string `json:"path"`
		Parents *bool  `json:"parents"`
	}
	if err := decode(w, r, &req, false); err != nil {
		writeError(w, err)
		return
	}
	q := r.URL.Query()
	q.Set("path", req.Path)
	r.URL.RawQuery = q.Encode()
	parents := req.Parents == nil || *req.Parents
	s.withFS(w, r, func(fs *files.FS, p string) error {
		e, err := fs.Mkdir(p, parents)
		if err != nil {
			return err
		}
		writeJSON(w, 200, e)
		return nil
	})
}

func (s *Server) downloadArchive(w http.ResponseWriter, r *http.Request) {
	s.withFS(w, r, func(fs *files.FS, p string) error {
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
	s.withFS(w, r, func(fs *files.FS, p string) error {
		n, err := fs.ExtractTar(p, r.Body)
		if err != nil {
			return err
		}
		writeJSON(w, 200, map[string]any{"path": p, "files": n})
		return nil
	})
}
