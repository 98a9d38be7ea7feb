package api

import (
	"bytes"
	"net/http"
	"sync"

	"github.com/ramify-dev/ramify/internal/sandbox"
)

// imageRoutes registers the images' routes (a sandbox runs on one with POST /v1/sandboxes {"image": name}).
func (s *Server) imageRoutes() {
	s.handle("POST /v1/images", s.auth(s.buildImage))
	s.handle("GET /v1/images", s.auth(s.listImages))
	s.handle("GET /v1/images/{name}", s.auth(s.getImage))
	s.handle("DELETE /v1/images/{name}", s.auth(s.deleteImage))
}

// buildImage builds a named image. With Accept: application/x-ndjson it streams {"type":"progress","data"}
// events and ends with {"type":"done","image"} or {"type":"error"}; otherwise it answers 201 with the image
// when the build is done. A client that goes away cancels the build.
func (s *Server) buildImage(w http.ResponseWriter, r *http.Request) {
	var req sandbox.BuildImageRequest
	if err := decode(w, r, &req, false); err != nil {
		writeError(w, err)
		return
	}
	if err := s.svc.CheckImageBuild(r.Context(), req); err != nil {
		writeError(w, err)
		return
	}
	if !wantsStream(r, false) {
		img, err := s.svc.BuildImage(r.Context(), req, nil)
		if err != nil {
			writeError(w, err)
			return
		}
		writeJSON(w, http.StatusCreated, img)
		return
	}
	n := newNDJSON(w)
	n.send(map[string]string{"type": "progress", "data": "building image " + req.Name + " on top of the default image"})
	lw := &lineWriter{emit: func(line string) { n.send(map[string]string{"type": "progress", "data": line}) }}
	img, err := s.svc.BuildImage(r.Context(), req, lw)
	lw.flush()
	n.finish(struct {
		Type  string            `json:"type"`
		Image sandbox.ImageInfo `json:"image"`
	}{"done", img}, err)
}

// lineWriter calls emit with each complete line written to it.
type lineWriter struct {
	mu   sync.Mutex
	buf  []byte
	emit func(string)
}

func (l *lineWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.buf = append(l.buf, p...)
	for {
		i := bytes.IndexByte(l.buf, '\n')
		if i < 0 {
			break
		}
		l.emit(string(l.buf[:i]))
		l.buf = l.buf[i+1:]
	}
	return len(p), nil
}

func (l *lineWriter) flush() {
	l.mu.Lock()
	defer l.mu.Unlock()
	if len(l.buf) > 0 {
		l.emit(string(l.buf))
		l.buf = nil
	}
}

func (s *Server) listImages(w http.ResponseWriter, r *http.Request) {
	imgs, err := s.svc.ListImages(r.Context())
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"images": imgs})
}

func (s *Server) getImage(w http.ResponseWriter, r *http.Request) {
	img, err := s.svc.GetImage(r.Context(), r.PathValue("name"))
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, img)
}

func (s *Server) deleteImage(w http.ResponseWriter, r *http.Request) {
	if err := s.svc.DeleteImage(r.Context(), r.PathValue("name")); err != nil {
		writeError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}
