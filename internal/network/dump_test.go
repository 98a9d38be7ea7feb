package network

import (
	"errors"
	"testing"

	"github.com/vishvananda/netlink/nl"
)

func TestRetryDump(t *testing.T) {
	other := errors.New("boom")
	for _, tc := range []struct {
		name      string
		interrupt int // how many first calls are interrupted
		final     error
		wantCalls int
		wantErr   error
	}{
		{"clean", 0, nil, 1, nil},
		{"interrupted twice", 2, nil, 3, nil},
		{"other error is not retried", 0, other, 1, other},
		{"always interrupted", 1000, nil, dumpAttempts, nl.ErrDumpInterrupted},
	} {
		t.Run(tc.name, func(t *testing.T) {
			calls := 0
			out, err := retryDump(func() ([]int, error) {
				calls++
				if calls <= tc.interrupt {
					return []int{calls}, nl.ErrDumpInterrupted
				}
				return []int{calls}, tc.final
			})
			if calls != tc.wantCalls || !errors.Is(err, tc.wantErr) || (tc.wantErr == nil && err != nil) {
				t.Fatalf("calls %d err %v, want %d %v", calls, err, tc.wantCalls, tc.wantErr)
			}
			if len(out) != 1 || out[0] != calls {
				t.Fatalf("result %v is not the last dump's", out)
			}
		})
	}
}
