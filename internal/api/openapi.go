package api

import "net/http"

// docRoutes registers the API's self-description.
func (s *Server) docRoutes(m *http.ServeMux) {}
