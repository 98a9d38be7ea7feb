package sandbox

import (
	"errors"
	"testing"

	"github.com/ramify-dev/ramify/internal/errdefs"
)

func TestNormalize(t *testing.T) {
	cases := []struct {
		name string
		in   CreateRequest
		err  string
	}{
		{"defaults", CreateRequest{}, ""},
		{"vcpu too small", CreateRequest{VCPU: 0.05}, "vcpu must be between 0.1 and 64"},
		{"mem too small", CreateRequest{MemMiB: 10}, "mem_mib must be between 64 and 262144"},
		{"procs", CreateRequest{MaxProcs: 1}, "max_procs must be between 16 and 65536"},
		{"disk too small", CreateRequest{DiskMiB: 63}, "disk_mib must be between 64 and 1048576"},
		{"disk negative", CreateRequest{DiskMiB: -1}, "disk_mib must be between 64 and 1048576"},
		{"disk too large", CreateRequest{DiskMiB: 1<<20 + 1}, "disk_mib must be between 64 and 1048576"},
		{"timeout negative", CreateRequest{TimeoutS: -1}, "timeout_s must be between 0 and 2592000"},
		{"on_timeout", CreateRequest{OnTimeout: "explode"}, `on_timeout must be "destroy" or "pause"`},
		{"relative cwd", CreateRequest{Cwd: "root"}, "cwd must be an absolute path"},
		{"env with =", CreateRequest{Env: map[string]string{"A=B": "x"}}, `invalid env entry "A=B": names are non-empty without '=' or NUL, values have no NUL`},
		{"ok", CreateRequest{VCPU: 0.5, MemMiB: 256, Env: map[string]string{"A": "1"}, Cwd: "/tmp/../srv"}, ""},
	}
	for _, c := range cases {
		got, err := c.in.normalize()
		if c.err == "" {
			if err != nil {
				t.Errorf("%s: %v", c.name, err)
			}
			if got.VCPU == 0 || got.MemMiB == 0 || got.Cwd == "" || got.DiskMiB == 0 {
				t.Errorf("%s: defaults not filled: %+v", c.name, got)
			}
			continue
		}
		if !errors.Is(err, errdefs.ErrInvalid) || errdefs.Message(err) != c.err {
			t.Errorf("%s: err = %v, want %q", c.name, err, c.err)
		}
	}
	got, _ := CreateRequest{Cwd: "/tmp/../srv"}.normalize()
	if got.Cwd != "/srv" {
		t.Errorf("cwd not cleaned: %q", got.Cwd)
	}
}

func TestIDs(t *testing.T) {
	id := NewID()
	if !ValidID(id) {
		t.Fatalf("NewID() = %q is not valid", id)
	}
	for _, bad := range []string{"", "sbx_", "sbx_XYZ", "sbx_../../etc/passwd00000000000000", id + "0", "abc_" + id[4:]} {
		if ValidID(bad) {
			t.Errorf("ValidID(%q) = true", bad)
		}
	}
	if s := shape(1, 1024); s != "1vcpu-1024mib" {
		t.Errorf("shape = %q", s)
	}
	if s := shape(0.5, 256); s != "0.5vcpu-256mib" {
		t.Errorf("shape = %q", s)
	}
}

func FuzzValidID(f *testing.F) {
	f.Add("sbx_0123456789abcdef0123456789abcdef")
	f.Add("../etc")
	f.Fuzz(func(t *testing.T, s string) {
		if ValidID(s) {
			for _, c := range s {
				if c == '/' || c == '.' || c == 0 {
					t.Fatalf("ValidID accepted %q", s)
				}
			}
		}
	})
}
