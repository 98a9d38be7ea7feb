package main

import (
	"strings"
	"testing"
)

// The server's default disk quota is checked at start like a request's disk_mib.
func TestServeDiskMiBFlag(t *testing.T) {
	t.Setenv("RAMIFY_DISK_MIB", "")
	f, err := parseServeFlags("serve", nil)
	if err != nil || f.diskMiB != 10240 {
		t.Fatalf("default: %+v, %v; want 10240", f, err)
	}
	if f, err := parseServeFlags("serve", []string{"--disk-mib", "2048"}); err != nil || f.diskMiB != 2048 {
		t.Fatalf("--disk-mib 2048: %v", err)
	}
	t.Setenv("RAMIFY_DISK_MIB", "4096")
	if f, err := parseServeFlags("serve", nil); err != nil || f.diskMiB != 4096 {
		t.Fatalf("RAMIFY_DISK_MIB=4096: %v", err)
	}
	for _, bad := range []string{"10", "0", "-1", "2000000"} {
		if _, err := parseServeFlags("serve", []string{"--disk-mib", bad}); err == nil || !strings.Contains(err.Error(), "disk_mib must be between 64 and 1048576") {
			t.Errorf("--disk-mib %s: err %v", bad, err)
		}
	}
}
