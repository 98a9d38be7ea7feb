package sandbox

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"path"
	"strings"
	"time"

	"github.com/ramify-dev/ramify/internal/errdefs"
	"github.com/ramify-dev/ramify/internal/image"
	"github.com/ramify-dev/ramify/internal/network"
)

// CreateRequest is the body of POST /v1/sandboxes. Zero values mean "default".
type CreateRequest struct {
	VCPU      float64           `json:"vcpu,omitempty"`
	MemMiB    int               `json:"mem_mib,omitempty"`
	MaxProcs  int               `json:"max_procs,omitempty"`
	DiskMiB   int               `json:"disk_mib,omitempty"`
	TimeoutS  int               `json:"timeout_s,omitempty"`
	OnTimeout string            `json:"on_timeout,omitempty"`
	Env       map[string]string `json:"env,omitempty"`
	Cwd       string            `json:"cwd,omitempty"`
	Metadata  map[string]string `json:"metadata,omitempty"`
	// Egress is the outbound allowlist (network.ParseEgress): absent (nil) is the server's default policy (the
	// public internet only), [] is no outbound traffic. No omitempty: the stored spec must keep [] apart from nil.
	Egress []string `json:"egress"`
	// IngressEnabled lets HTTP clients reach the sandbox's ports through the server's ingress (ingress.go).
	IngressEnabled bool `json:"ingress_enabled,omitempty"`
	// Template names the template the sandbox starts from (template.go): its files, interpreter session and,
	// for every field above left zero, its spec.
	Template string `json:"template,omitempty"`
	// Image names the image the sandbox runs on (images.go): "" or "default" is the default image; stored as ""
	// for it.
	Image string `json:"image,omitempty"`
	// SSHPubkeys are the authorized_keys lines of the keys that may open an SSH session as the sandbox (ssh.go),
	// stored in canonical form ("type base64 comment"); inherited by forks.
	SSHPubkeys []string `json:"ssh_pubkeys,omitempty"`
}

// Defaults and bounds of a sandbox's shape.
const (
	DefaultVCPU     = 1.0
	DefaultMemMiB   = 1024
	DefaultMaxProcs = 512
	DefaultCwd      = "/root"
)

// Disk quota: the default when neither the request nor the server (Config.DiskMiB) sets one, and the bounds.
const (
	DefaultDiskMiB = 10240
	MinDiskMiB     = 64
	MaxDiskMiB     = 1 << 20
)

// ValidDiskMiB checks a disk_mib value (a request's, or the server's default).
func ValidDiskMiB(n int) error {
	if n < MinDiskMiB || n > MaxDiskMiB {
		return invalid("disk_mib must be between %d and %d", MinDiskMiB, MaxDiskMiB)
	}
	return nil
}

func invalid(format string, a ...any) error {
	return errdefs.New(errdefs.ErrInvalid, fmt.Sprintf(format, a...))
}

// normalize fills defaults and validates; the result is what is stored and applied.
func (r CreateRequest) normalize() (CreateRequest, error) {
	if r.VCPU == 0 {
		r.VCPU = DefaultVCPU
	}
	if r.MemMiB == 0 {
		r.MemMiB = DefaultMemMiB
	}
	if r.MaxProcs == 0 {
		r.MaxProcs = DefaultMaxProcs
	}
	if r.Cwd == "" {
		r.Cwd = DefaultCwd
	}
	if r.DiskMiB == 0 {
		r.DiskMiB = DefaultDiskMiB
	}
	if err := ValidDiskMiB(r.DiskMiB); err != nil {
		return r, err
	}
	if r.OnTimeout == "" {
		r.OnTimeout = "destroy"
	}
	switch {
	case r.VCPU < 0.1 || r.VCPU > 64:
		return r, invalid("vcpu must be between 0.1 and 64")
	case r.MemMiB < 64 || r.MemMiB > 262144:
		return r, invalid("mem_mib must be between 64 and 262144")
	case r.MaxProcs < 16 || r.MaxProcs > 65536:
		return r, invalid("max_procs must be between 16 and 65536")
	case r.TimeoutS < 0 || r.TimeoutS > MaxTimeoutS:
		return r, invalid("timeout_s must be between 0 and 2592000")
	case r.OnTimeout != "destroy" && r.OnTimeout != "pause":
		return r, invalid(`on_timeout must be "destroy" or "pause"`)
	case !path.IsAbs(r.Cwd) || strings.ContainsRune(r.Cwd, 0) || len(r.Cwd) > 4096:
		return r, invalid("cwd must be an absolute path")
	case len(r.Env) > 1024:
		return r, invalid("env has more than 1024 entries")
	case len(r.Metadata) > 64:
		return r, invalid("metadata has more than 64 entries")
	}
	r.Cwd = path.Clean(r.Cwd)
	if r.Image != "" {
		if err := image.ValidName(r.Image); err != nil {
			return r, err
		}
		r.Image = imageName(r.Image)
	}
	keys, err := normalizeSSHKeys(nil, r.SSHPubkeys)
	if err != nil {
		return r, err
	}
	r.SSHPubkeys = keys
	if _, err := network.ParseEgress(r.Egress); err != nil {
		return r, err
	}
	for k, v := range r.Env {
		if err := validEnv(k, v); err != nil {
			return r, err
		}
	}
	for k, v := range r.Metadata {
		if k == "" || len(k) > 256 || len(v) > 4096 {
			return r, invalid("metadata keys must be 1..256 bytes and values at most 4096 bytes")
		}
	}
	return r, nil
}

func validEnv(k, v string) error {
	if k == "" || strings.ContainsAny(k, "=\x00") || strings.ContainsRune(v, 0) || len(k)+len(v) > 128<<10 {
		return invalid("invalid env entry %q: names are non-empty without '=' or NUL, values have no NUL", k)
	}
	return nil
}

// NewID returns a fresh sandbox id: "sbx_" and 32 hex digits.
func NewID() string {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err)
	}
	return "sbx_" + hex.EncodeToString(b[:])
}

// ValidID reports whether id has the shape of a sandbox id.
func ValidID(id string) bool {
	if len(id) != 36 || !strings.HasPrefix(id, "sbx_") {
		return false
	}
	for _, c := range id[4:] {
		if !(c >= '0' && c <= '9' || c >= 'a' && c <= 'f') {
			return false
		}
	}
	return true
}

func hostnameOf(id string) string { return "sbx-" + id[4:12] }

// Info is the API view of a sandbox.
type Info struct {
	ID         string            `json:"id"`
	Status     Status            `json:"status"`
	IP         string            `json:"ip"`
	Hostname   string            `json:"hostname"`
	VCPU       float64           `json:"vcpu"`
	MemMiB     int               `json:"mem_mib"`
	MaxProcs   int               `json:"max_procs"`
	DiskMiB    int               `json:"disk_mib"` // 0: none (created before disk quotas); enforced by the btrfs driver only
	Shape      string            `json:"shape"`
	TimeoutS   int               `json:"timeout_s"`
	OnTimeout  string            `json:"on_timeout"`
	ExpiresAt  *time.Time        `json:"expires_at"`
	Cwd        string            `json:"cwd"`
	Metadata   map[string]string `json:"metadata"`
	CreatedAt  time.Time         `json:"created_at"`
	FamilyID   string            `json:"family_id"`
	ParentID   *string           `json:"parent_id"`
	ForkedFrom *string           `json:"forked_from"`
	Error      string            `json:"error"`
	// Egress is the outbound allowlist; null means the server's default policy (public internet only).
	Egress []string `json:"egress"`
	// Ingress says whether the sandbox's ports are reachable through the ingress, and where.
	Ingress IngressInfo `json:"ingress"`
	// Image is the image the sandbox runs on ("default" for the default image).
	Image string `json:"image"`
	// Template is the template the sandbox was created from, if any.
	Template string `json:"template,omitempty"`
	// Pause reports the last pause and resume: what could not be saved, sizes, timings.
	Pause *PauseInfo `json:"pause,omitempty"`
	// Progress is how far the pause or resume in flight has got: while pausing or resuming only.
	Progress *Progress `json:"progress,omitempty"`
	// Usage is the sandbox's resource use now: in GET of a running sandbox only (not in lists).
	Usage *UsageInfo `json:"usage,omitempty"`
	// SSH lists the authorized keys and, when the server runs its SSH server, the command that connects.
	SSH *SSHInfo `json:"ssh,omitempty"`
}

func shape(vcpu float64, mem int) string {
	return fmt.Sprintf("%svcpu-%dmib", strings.TrimSuffix(strings.TrimRight(fmt.Sprintf("%.2f", vcpu), "0"), "."), mem)
}

// ValidStatus checks a status named by a client (a list filter, a wait target): one of the statuses a client
// can see.
func ValidStatus(s Status) error {
	switch s {
	case StatusCreating, StatusRunning, StatusPausing, StatusPaused, StatusResuming, StatusError:
		return nil
	}
	return invalid("unknown status %q (want creating, running, pausing, paused, resuming or error)", s)
}
