package api

import (
	_ "embed"
	"net/http"
)

// openAPIDoc is the OpenAPI 3.1 description of every route (openapi_test.go checks it against the routes).
//
//go:embed openapi.json
var openAPIDoc []byte

// docRoutes registers the API's self-description: GET /v1/openapi.json, without authentication like /healthz.
func (s *Server) docRoutes(m *http.ServeMux) {
	s.handle("GET /v1/openapi.json", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusOK)
		w.Write(openAPIDoc) //nolint:errcheck // the client went away
	}))
}
