package api

import (
	"encoding/json"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/ramify-dev/ramify/internal/errdefs"
	"github.com/ramify-dev/ramify/internal/files"
	"github.com/ramify-dev/ramify/internal/sandbox"
)

// extraRoutes registers the fork family's routes (fork, merge_into, diff), pause and resume, and keepalive.
func (s *Server) extraRoutes(m *http.ServeMux) {
	s.handle("POST /v1/sandboxes/{id}/fork", s.auth(s.fork))
	s.handle("POST /v1/sandboxes/{id}/merge_into/{winner}", s.auth(s.mergeInto))
	s.handle("GET /v1/sandboxes/{id}/diff/{other}", s.auth(s.diff))
	s.handle("POST /v1/sandboxes/{id}/diff/{other}", s.auth(s.diff))
	s.handle("POST /v1/sandboxes/{id}/pause", s.auth(s.pause))
	s.handle("POST /v1/sandboxes/{id}/resume", s.auth(s.resume))
	s.handle("POST /v1/sandboxes/{id}/timeout", s.auth(s.setTimeout))
	s.handle("POST /v1/sandboxes/{id}/ssh_keys", s.auth(s.addSSHKeys))
}

// setTimeout is keepalive: the sandbox now times out timeout_s seconds from now (0: never).
func (s *Server) setTimeout(w http.ResponseWriter, r *http.Request) {
	var req struct {
		TimeoutS *int `json:"timeout_s"`
	}
	if err := decode(w, r, &req, false); err != nil {
		writeError(w, err)
		return
	}
	if req.TimeoutS == nil {
		writeError(w, errdefs.New(errdefs.ErrInvalid, "timeout_s is required"))
		return
	}
	info, err := s.svc.SetTimeout(r.Context(), r.PathValue("id"), *req.TimeoutS)
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, info)
}

// addSSHKeys authorizes more SSH keys on a sandbox: {"keys": [authorized_keys lines]}.
func (s *Server) addSSHKeys(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Keys []string `json:"keys"`
	}
	if err := decode(w, r, &req, false); err != nil {
		writeError(w, err)
		return
	}
	info, err := s.svc.AddSSHKeys(r.Context(), r.PathValue("id"), req.Keys)
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, info)
}

// lifecycleReply answers pause and resume: 202 with the new status and X-Poll-After when work started, 200 when
// the sandbox already was where the call would take it.
func lifecycleReply(w http.ResponseWriter, info sandbox.Info, accepted bool) {
	code := http.StatusOK
	if accepted {
		code = http.StatusAccepted
		w.Header().Set("X-Poll-After", strconv.Itoa(int(sandbox.PollAfter/time.Second)))
	}
	writeJSON(w, code, info)
}

func (s *Server) pause(w http.ResponseWriter, r *http.Request) {
	info, accepted, err := s.svc.Pause(r.Context(), r.PathValue("id"))
	if err != nil {
		writeError(w, err)
		return
	}
	lifecycleReply(w, info, accepted)
}

func (s *Server) resume(w http.ResponseWriter, r *http.Request) {
	info, accepted, err := s.svc.Resume(r.Context(), r.PathValue("id"))
	if err != nil {
		writeError(w, err)
		return
	}
	lifecycleReply(w, info, accepted)
}

func (s *Server) fork(w http.ResponseWriter, r *http.Request) {
	var req struct {
		N           json.RawMessage `json:"n"` // raw: an explicit null is refused, not taken for "absent"
		StartPaused bool            `json:"start_paused"`
		Egress      *[]string       `json:"egress"`
		Ingress     *bool           `json:"ingress_enabled"`
		SSHPubkeys  []string        `json:"ssh_pubkeys"`
	}
	if err := decode(w, r, &req, true); err != nil {
		writeError(w, err)
		return
	}
	n := 1
	if req.N != nil {
		if err := json.Unmarshal(req.N, &n); err != nil || string(req.N) == "null" {
			writeError(w, errdefs.New(errdefs.ErrInvalid, "n must be an integer between 1 and 32"))
			return
		}
	}
	res, err := s.svc.ForkWithOptions(r.Context(), r.PathValue("id"), n,
		sandbox.ForkOptions{StartPaused: req.StartPaused, Egress: req.Egress, IngressEnabled: req.Ingress,
			SSHPubkeys: req.SSHPubkeys})
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, res)
}

func (s *Server) mergeInto(w http.ResponseWriter, r *http.Request) {
	winner := r.PathValue("winner")
	if !sandbox.ValidID(winner) {
		writeError(w, errNotFound)
		return
	}
	if err := s.svc.MergeInto(r.Context(), r.PathValue("id"), winner); err != nil {
		writeError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) diff(w http.ResponseWriter, r *http.Request) {
	other := r.PathValue("other")
	if !sandbox.ValidID(other) {
		writeError(w, errNotFound)
		return
	}
	q := r.URL.Query()
	paths, b64s := q["paths"], q["paths_b64"]
	if r.Method == http.MethodPost {
		var req struct {
			Paths    []string `json:"paths"`
			PathsB64 []string `json:"paths_b64"`
		}
		if err := decode(w, r, &req, true); err != nil {
			writeError(w, err)
			return
		}
		paths = append(paths, req.Paths...)
		b64s = append(b64s, req.PathsB64...)
	}
	paths, err := diffPaths(paths, b64s)
	if err != nil {
		writeError(w, err)
		return
	}
	res, err := s.svc.Diff(r.Context(), r.PathValue("id"), other, paths)
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, res)
}

// diffPaths is the directories a diff request names: as paths or as paths_b64 (each the standard base64 of a
// path's raw bytes), not both. A path holding a NUL byte is refused.
func diffPaths(paths, b64s []string) ([]string, error) {
	if len(paths) > 0 && len(b64s) > 0 {
		return nil, errdefs.New(errdefs.ErrInvalid, "give paths or paths_b64, not both")
	}
	if len(b64s) > 0 {
		paths = make([]string, 0, len(b64s))
		for _, b := range b64s {
			p, _, err := files.PathParam("paths", "", false, b, true)
			if err != nil {
				return nil, err
			}
			paths = append(paths, p)
		}
	}
	for _, p := range paths {
		if strings.IndexByte(p, 0) >= 0 {
			return nil, errdefs.New(errdefs.ErrInvalid, "paths must not contain NUL bytes")
		}
	}
	return paths, nil
}
