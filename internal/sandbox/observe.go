package sandbox

import (
	"context"
	"sort"
	"time"

	"github.com/ramify-dev/ramify/internal/events"
	"github.com/ramify-dev/ramify/internal/runtime"
)

// This file is where the service tells the outside what happened: lifecycle events for GET /v1/events (and, as
// their watcher, the metrics), and the gauges a metrics scrape reads (Stats, Usages).

// emit publishes a lifecycle event (a no-op without Config.Events). It may be called with s.mu held: the hub
// never blocks on its followers.
func (s *Service) emit(e events.Event) {
	s.cfg.Events.Publish(e)
}

// emitStatus publishes the event of e's status change to to, for the changes that have one of their own (the
// others are published with more detail where they happen: created, forked, paused, resumed). The caller holds
// s.mu.
func (s *Service) emitStatus(e *entry, from, to Status) {
	switch {
	case to == StatusError:
		s.emit(events.Event{Type: events.Error, Sandbox: e.rec.ID, Family: e.rec.FamilyID, Status: string(to),
			Error: e.rec.Error})
	case from == StatusPausing && to == StatusRunning:
		s.emit(events.Event{Type: events.PauseFailed, Sandbox: e.rec.ID, Family: e.rec.FamilyID, Status: string(to),
			Error: s.pauseInfo(e).Error})
	case from == StatusResuming && to == StatusPaused:
		s.emit(events.Event{Type: events.ResumeFailed, Sandbox: e.rec.ID, Family: e.rec.FamilyID, Status: string(to),
			Error: s.pauseInfo(e).Error})
	case to == StatusPausing:
		s.emit(events.Event{Type: events.Pausing, Sandbox: e.rec.ID, Family: e.rec.FamilyID, Status: string(to)})
	case to == StatusResuming:
		s.emit(events.Event{Type: events.Resuming, Sandbox: e.rec.ID, Family: e.rec.FamilyID, Status: string(to)})
	}
}

func msSince(t time.Time) float64 { return ms(time.Since(t)) }

// Stats is what the service holds now, for the metrics.
type Stats struct {
	// Sandboxes counts the sandboxes the API shows, by status.
	Sandboxes map[Status]int
	// Warm is how many pre-started sandboxes are ready; WarmTarget how many the pool keeps.
	Warm, WarmTarget int
	// Ahead is how many children made ahead of forks are ready, AheadLimit the most there may be (ahead.go);
	// AheadMade, AheadUsed and AheadDropped count those made, taken by a fork and dropped unused since start.
	Ahead, AheadLimit                  int
	AheadMade, AheadUsed, AheadDropped int64
}

// Stats counts the sandboxes by status and the warm pool.
func (s *Service) Stats() Stats {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := Stats{Sandboxes: map[Status]int{}, Warm: len(s.warm), WarmTarget: s.cfg.WarmPool,
		Ahead: s.aheadKidsLocked(), AheadLimit: s.cfg.ForkAhead, AheadMade: s.aheadCount.made, AheadUsed: s.aheadCount.used,
		AheadDropped: s.aheadCount.dropped}
	for _, e := range s.items {
		if e.gone || e.pooled {
			continue
		}
		st.Sandboxes[Status(e.rec.Status)]++
	}
	return st
}

// SandboxUsage is one running sandbox's resource use, for the per-sandbox metrics.
type SandboxUsage struct {
	ID, Family string
	Usage      UsageInfo
}

// Usages reads the resource use of at most limit running sandboxes, the most recently created first (their
// cgroups and layers are read outside s.mu). Sandboxes that stop running meanwhile are left out.
func (s *Service) Usages(limit int) []SandboxUsage {
	if limit <= 0 {
		return nil
	}
	type one struct {
		id, family string
		created    time.Time
		h          runtime.Handle
	}
	s.mu.Lock()
	var all []one
	for _, e := range s.items {
		if e.gone || e.pooled || Status(e.rec.Status) != StatusRunning {
			continue
		}
		all = append(all, one{e.rec.ID, e.rec.FamilyID, e.rec.CreatedAt, e.handle})
	}
	s.mu.Unlock()
	sort.Slice(all, func(i, j int) bool { return all[i].created.After(all[j].created) })
	if len(all) > limit {
		all = all[:limit]
	}
	out := make([]SandboxUsage, 0, len(all))
	for _, o := range all {
		u, err := s.cfg.Runtime.Usage(o.h)
		if err != nil {
			continue
		}
		out = append(out, SandboxUsage{ID: o.id, Family: o.family, Usage: *usageOf(u)})
	}
	return out
}

// Logs returns the recent log lines of a sandbox's agent and of its fork family's init, oldest first (empty for a
// sandbox that is not running, or when the runtime keeps no logs).
func (s *Service) Logs(ctx context.Context, id string) ([]runtime.LogLine, error) {
	e, err := s.lookup(id)
	if err != nil {
		return nil, err
	}
	s.mu.Lock()
	host, family := e.rec.Hostname, e.rec.FamilyID
	s.mu.Unlock()
	out := []runtime.LogLine{}
	if lk, ok := s.cfg.Runtime.(runtime.LogKeeper); ok {
		out = append(out, lk.Logs(host, family)...)
	}
	return out, nil
}
