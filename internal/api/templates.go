package api

import (
	"net/http"

	"github.com/ramify-dev/ramify/internal/errdefs"
	"github.com/ramify-dev/ramify/internal/sandbox"
)

// templateRoutes registers the templates' routes (a sandbox is created from one by POST /v1/sandboxes).
func (s *Server) templateRoutes() {
	s.handle("POST /v1/templates", s.auth(s.saveTemplate))
	s.handle("GET /v1/templates", s.auth(s.listTemplates))
	s.handle("GET /v1/templates/{name}", s.auth(s.getTemplate))
	s.handle("DELETE /v1/templates/{name}", s.auth(s.deleteTemplate))
}

func (s *Server) saveTemplate(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Name string `json:"name"`
		From string `json:"from"`
	}
	if err := decode(w, r, &req, false); err != nil {
		writeError(w, err)
		return
	}
	if err := sandbox.ValidTemplateName(req.Name); err != nil {
		writeError(w, err)
		return
	}
	if req.From == "" {
		writeError(w, errdefs.New(errdefs.ErrInvalid, "from is required: the id of the running sandbox to capture"))
		return
	}
	if !sandbox.ValidID(req.From) {
		writeError(w, errNotFound)
		return
	}
	t, err := s.svc.SaveTemplate(r.Context(), req.Name, req.From)
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusCreated, t)
}

func (s *Server) listTemplates(w http.ResponseWriter, r *http.Request) {
	ts, err := s.svc.ListTemplates(r.Context())
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"templates": ts})
}

func (s *Server) getTemplate(w http.ResponseWriter, r *http.Request) {
	t, err := s.svc.GetTemplate(r.Context(), r.PathValue("name"))
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, http.StatusOK, t)
}

func (s *Server) deleteTemplate(w http.ResponseWriter, r *http.Request) {
	if err := s.svc.DeleteTemplate(r.Context(), r.PathValue("name")); err != nil {
		writeError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}
