package sandbox

import (
	"context"
	"encoding/json"
	"time"

	"github.com/ramify-dev/ramify/internal/errdefs"
)

// MaxTimeoutS bounds a sandbox's timeout_s, at create and at SetTimeout: 30 days.
const MaxTimeoutS = 30 * 24 * 3600

// timeoutBase is the instant a sandbox's timeout_s counts from: its creation, or the last SetTimeout.
func timeoutBase(e *entry) time.Time {
	if !e.timeoutFrom.IsZero() {
		return e.timeoutFrom
	}
	return e.rec.CreatedAt
}

// timeoutOfSpec is what a stored spec carries beyond the create request: the base of a timeout set later.
type timeoutOfSpec struct {
	TimeoutFrom *time.Time `json:"timeout_from,omitempty"`
}

// specJSON is the stored form of a sandbox's spec: the normalised create request, plus timeout_from once
// SetTimeout has moved the base of its timeout.
func specJSON(spec CreateRequest, timeoutFrom time.Time) []byte {
	b, _ := json.Marshal(spec) //nolint:errchkjson // plain data
	if timeoutFrom.IsZero() {
		return b
	}
	var m map[string]json.RawMessage
	json.Unmarshal(b, &m) //nolint:errcheck // just marshalled
	m["timeout_from"], _ = json.Marshal(timeoutFrom.UTC())
	b, _ = json.Marshal(m)
	return b
}

// SetTimeout extends (or shortens) a running or paused sandbox's life: it now times out timeoutS seconds from
// now (0: never), with its on_timeout action. The timer is re-armed and the new deadline stored, so it holds
// across a server restart. A sandbox whose destroy timeout has already fired cannot be kept alive (409).
func (s *Service) SetTimeout(ctx context.Context, id string, timeoutS int) (Info, error) {
	if timeoutS < 0 || timeoutS > MaxTimeoutS {
		return Info{}, invalid("timeout_s must be between 0 and %d", MaxTimeoutS)
	}
	// Shared: a keepalive must not wait for a long run_code; it excludes destroy, pause, resume, merge.
	es, release, err := s.acquire(shared, OpSetTimeout, id)
	if err != nil {
		return Info{}, err
	}
	defer release()
	e := es[0]
	e.keep.Lock() // concurrent SetTimeouts: the stored record and the timer end up agreeing
	defer e.keep.Unlock()

	now := time.Now().UTC()
	s.mu.Lock()
	spec := e.spec
	spec.TimeoutS = timeoutS
	rec := e.rec
	rec.Spec = specJSON(spec, now)
	fired := e.timer != nil && !e.timer.Stop()
	if fired && e.spec.OnTimeout != "pause" {
		s.mu.Unlock()
		return Info{}, errdefs.New(errdefs.ErrConflict, "the sandbox has timed out and is being destroyed")
	}
	s.mu.Unlock()
	if err := s.cfg.Store.Put(ctx, rec); err != nil {
		s.mu.Lock()
		if !fired {
			e.timer = nil
			s.armTimerLocked(e) // the old deadline
		}
		s.mu.Unlock()
		return Info{}, err
	}
	s.mu.Lock()
	e.spec, e.timeoutFrom, e.rec.Spec, e.timer = spec, now, rec.Spec, nil
	s.armTimerLocked(e)
	info := s.info(e)
	s.mu.Unlock()
	s.log.Info("sandbox timeout set", "sandbox", id, "timeout_s", timeoutS)
	return info, nil
}
