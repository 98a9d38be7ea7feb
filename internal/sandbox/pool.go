package sandbox

import (
	"context"
	"encoding/json"
	"time"

	"github.com/ramify-dev/ramify/internal/events"
	"github.com/ramify-dev/ramify/internal/runtime"
)

// The warm pool keeps a few sandboxes started ahead of time (recorded with status warm, invisible to the API),
// so that Create only has to apply the request's limits, env and cwd to one: milliseconds instead of the
// ~100 ms a cold start takes. Claimed sandboxes are replaced in the background.

// kickPool wakes the refill goroutine.
func (s *Service) kickPool() {
	select {
	case s.refill <- struct{}{}:
	default:
	}
}

// fillPool runs in the background (goBackground) until Close.
func (s *Service) fillPool() {
	for {
		select {
		case <-s.ctx.Done():
			return
		case <-s.refill:
		}
		for {
			s.mu.Lock()
			need := len(s.warm) < s.cfg.WarmPool
			s.mu.Unlock()
			if !need {
				break
			}
			if s.ctx.Err() != nil {
				return
			}
			spec, _ := CreateRequest{DiskMiB: s.cfg.DiskMiB}.normalize()
			info, err := s.createCold(s.ctx, spec, StatusWarm)
			if err != nil {
				if s.ctx.Err() != nil {
					return
				}
				s.log.Warn("warm pool: start a sandbox", "err", err)
				select {
				case <-s.ctx.Done():
					return
				case <-time.After(time.Second):
				}
				continue
			}
			s.mu.Lock()
			if e := s.items[info.ID]; e != nil {
				s.warm = append(s.warm, e)
			}
			s.mu.Unlock()
		}
	}
}

// claimWarm takes a warm sandbox, applies spec to it and makes it a running sandbox. ok is false when the pool
// was empty or the claim failed (then the caller starts one cold).
func (s *Service) claimWarm(ctx context.Context, spec CreateRequest) (Info, bool) {
	defer s.kickPool()
	return s.claimFrom(ctx, &s.warm, spec)
}

// claimTimeout bounds the configuration of a claimed warm sandbox (~1 ms when its agent answers).
const claimTimeout = 10 * time.Second

// claimFrom is claimWarm from the pool *pool (guarded by s.mu): the plain pool, or a template's.
func (s *Service) claimFrom(ctx context.Context, pool *[]*entry, spec CreateRequest) (Info, bool) {
	s.mu.Lock()
	if len(*pool) == 0 {
		s.mu.Unlock()
		return Info{}, false
	}
	e := (*pool)[0]
	*pool = (*pool)[1:]
	h := e.handle
	s.mu.Unlock()

	release, err := s.acquireEntries(exclusive, func(e *entry) error {
		return transition(e.rec.ID, Status(e.rec.Status), StatusRunning)
	}, e)
	if err != nil {
		s.log.Warn("warm pool: claim refused, starting cold", "sandbox", h.ID, "err", err)
		return Info{}, false
	}
	defer release()
	start := time.Now()
	// Bounded: a warm sandbox whose agent does not answer (stopped from the host) is dropped, and the create
	// starts one cold, instead of waiting for it.
	cctx, cancel := context.WithTimeout(ctx, claimTimeout)
	defer cancel()
	if err := s.cfg.Runtime.Configure(cctx, h, runtime.Spec{ID: h.ID, VCPU: spec.VCPU, MemMiB: spec.MemMiB,
		MaxProcs: spec.MaxProcs, DiskMiB: spec.DiskMiB, Env: spec.Env, Cwd: spec.Cwd,
		Egress: spec.Egress}); err != nil {
		s.log.Warn("warm pool: claim failed, starting cold", "sandbox", h.ID, "err", err)
		s.dropWarm(e)
		return Info{}, false
	}
	specJSON, _ := json.Marshal(spec)
	s.mu.Lock()
	rec := e.rec
	rec.Spec, rec.Status, rec.CreatedAt = specJSON, string(StatusRunning), time.Now().UTC()
	s.mu.Unlock()
	if err := s.cfg.Store.Put(ctx, rec); err != nil {
		s.log.Warn("warm pool: save claimed sandbox", "sandbox", h.ID, "err", err)
		s.dropWarm(e)
		return Info{}, false
	}
	s.mu.Lock()
	e.spec = spec
	e.rec.Spec, e.rec.CreatedAt = rec.Spec, rec.CreatedAt
	s.setStatus(e, StatusRunning) //nolint:errcheck // admitted above; e is held exclusively
	e.pooled = false
	s.mu.Unlock()
	s.armTimer(e)
	s.log.Info("sandbox created", "sandbox", rec.ID, "ip", rec.IP, "warm", true, "ms", time.Since(start).Milliseconds())
	s.emit(events.Event{Type: events.Created, Sandbox: rec.ID, Family: rec.FamilyID, Status: string(StatusRunning),
		Ms: msSince(start)})
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.info(e), true
}

// dropWarm destroys a warm sandbox that could not be claimed.
func (s *Service) dropWarm(e *entry) {
	s.cfg.Runtime.Destroy(context.Background(), e.handle) //nolint:errcheck // best effort
	s.cfg.Store.Delete(context.Background(), e.rec.ID)    //nolint:errcheck
	s.mu.Lock()
	s.retire(e)
	s.mu.Unlock()
}
