package sandbox

import (
	"fmt"
	"strings"

	"github.com/ramify-dev/ramify/internal/errdefs"
)

// IngressInfo is the API view of a sandbox's ingress: whether its ports are reachable from outside, and the URL
// templates to reach them ("{port}" stands for the port number).
type IngressInfo struct {
	Enabled bool `json:"enabled"`
	// URLTemplate is the ingress listener's URL, "http://{port}-<id without sbx_>.<domain>:<listen port>/";
	// absent when ingress is off for the sandbox or the server has no ingress listener.
	URLTemplate string `json:"url_template,omitempty"`
	// PathTemplate is the API route, "/v1/sandboxes/<id>/ports/{port}/" (with the API key); absent when off.
	PathTemplate string `json:"path_template,omitempty"`
}

// IngressLabel is the DNS label that names a sandbox's port in an ingress host: "<port>-<id without sbx_>"
// (a sandbox id's underscore is not valid in a DNS label).
func IngressLabel(id string, port string) string { return port + "-" + strings.TrimPrefix(id, "sbx_") }

// ParseIngressLabel reads a label made by IngressLabel: the sandbox id and the port (1..65535).
func ParseIngressLabel(label string) (id string, port int, ok bool) {
	p, hex, ok := strings.Cut(label, "-")
	if !ok || len(p) == 0 || len(p) > 5 || !ValidID("sbx_"+hex) {
		return "", 0, false
	}
	for _, c := range p {
		if c < '0' || c > '9' {
			return "", 0, false
		}
		port = port*10 + int(c-'0')
	}
	if port < 1 || port > 65535 || p[0] == '0' {
		return "", 0, false
	}
	return "sbx_" + hex, port, true
}

func (s *Service) ingressInfo(id string, spec CreateRequest) IngressInfo {
	if !spec.IngressEnabled {
		return IngressInfo{}
	}
	in := IngressInfo{Enabled: true, PathTemplate: "/v1/sandboxes/" + id + "/ports/{port}/"}
	if s.cfg.IngressHost != "" {
		in.URLTemplate = "http://" + IngressLabel(id, "{port}") + "." + s.cfg.IngressHost + "/"
	}
	return in
}

// IngressAddr returns the address of a sandbox that ingress may reach now: an ingress-enabled, running sandbox.
// Any other id is ErrNotFound, saying why. No hold is taken: a proxied connection does not keep the sandbox from
// pausing, forking or being deleted (its connections then break).
func (s *Service) IngressAddr(id string) (string, error) {
	e, err := s.lookup(id)
	if err != nil {
		return "", err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	switch st := Status(e.rec.Status); {
	case !e.spec.IngressEnabled:
		return "", errdefs.New(errdefs.ErrNotFound, fmt.Sprintf("sandbox %s was created without ingress_enabled: its ports are not reachable", id))
	case st != StatusRunning:
		return "", errdefs.New(errdefs.ErrNotFound, fmt.Sprintf("sandbox %s is %s, not running: its ports are not reachable", id, st))
	}
	return e.rec.IP, nil
}
