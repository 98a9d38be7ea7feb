package api

import "net/http"

// extraRoutes registers routes of capabilities that live in their own files.
func (s *Server) extraRoutes(m *http.ServeMux) {}
