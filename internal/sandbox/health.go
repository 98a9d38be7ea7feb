package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/ramify-dev/ramify/internal/events"
	"github.com/ramify-dev/ramify/internal/runtime"
	"github.com/ramify-dev/ramify/internal/store"
)

// healthInterval is how often the service asks the runtime which sandboxes lost their machinery: a sandbox whose
// agent died is noticed within about this long, and restored or marked error.
const healthInterval = 500 * time.Millisecond

// watchHealth keeps the API from reporting "running" for a sandbox that cannot answer. When a sandbox's agent or
// family init dies anyway (killed from the host, out of memory, a bug: nothing inside a sandbox can reach them),
// the sandbox is restarted on its own files with a fresh interpreter, or, if that fails, marked error with why.
func (s *Service) watchHealth(h runtime.Healer) {
	t := time.NewTicker(healthInterval)
	defer t.Stop()
	for {
		select {
		case <-s.ctx.Done():
			return
		case <-t.C:
		}
		for _, l := range h.Lost() {
			s.healAside(h, l)
		}
	}
}

// healAside heals l in a goroutine of its own, unless one heals it already: a sandbox held up (its family's init
// stopped from the host, say) delays no other's restart.
func (s *Service) healAside(h runtime.Healer, l runtime.Lost) {
	id := l.Handle.ID
	s.mu.Lock()
	if s.healing == nil {
		s.healing = map[string]bool{}
	}
	busy := s.healing[id]
	s.healing[id] = true
	s.mu.Unlock()
	if busy {
		return
	}
	done := func() {
		s.mu.Lock()
		delete(s.healing, id)
		s.mu.Unlock()
	}
	if !s.goBackground(func() { defer done(); s.heal(h, l) }) {
		done()
	}
}

// heal revives one lost sandbox, if it is still the running sandbox the runtime saw lost.
func (s *Service) heal(h runtime.Healer, l runtime.Lost) {
	if s.dropLostAhead(l.Handle.ID) {
		return
	}
	es, release, err := s.acquire(exclusive, OpRestart, l.Handle.ID)
	if err != nil {
		return // destroyed, paused or warm meanwhile (a failed warm claim drops the sandbox)
	}
	defer release()
	e := es[0]
	s.mu.Lock()
	cur := e.handle
	s.mu.Unlock()
	if cur.AgentPid != l.Handle.AgentPid || cur.AgentStart != l.Handle.AgentStart {
		return // it changed under us (merged, already revived)
	}
	ctx, cancel := context.WithTimeout(s.ctx, 30*time.Second)
	defer cancel()
	start := time.Now()
	rec, _ := s.restartProcesses(ctx, h, e, cur, "ramify's processes for this sandbox died ("+l.Reason+")", l.Reason)
	if rec.Status == string(StatusError) {
		s.log.Error("sandbox lost", "sandbox", rec.ID, "reason", l.Reason, "err", rec.Error)
		return
	}
	s.log.Warn("sandbox restarted: its interpreter's state is lost, its files are kept", "sandbox", rec.ID,
		"reason", l.Reason, "ms", time.Since(start).Milliseconds())
}

// restartProcesses restarts sandbox e's processes (handle h; the caller holds e exclusively) in a family of
// their own on its files, through hl's Revive (nil: a runtime that cannot), because of why (a sentence for the
// sandbox's error, or for its next run_code: its interpreter's state is lost). A sandbox that cannot be
// restarted is error. The record is stored; a restart is announced with reason. It returns the record and the
// restart's error.
func (s *Service) restartProcesses(ctx context.Context, hl runtime.Healer, e *entry, h runtime.Handle, why, reason string) (store.Record, error) {
	s.mu.Lock()
	spec, ip, hostname := e.spec, e.rec.IP, e.rec.Hostname
	s.mu.Unlock()
	var nh runtime.Handle
	err := errors.New("this runtime cannot restart a sandbox")
	if hl != nil {
		nh, err = hl.Revive(ctx, h, runtime.Spec{
			ID: h.ID, Hostname: hostname, IP: parseIP(ip), VCPU: spec.VCPU, MemMiB: spec.MemMiB, MaxProcs: spec.MaxProcs,
			DiskMiB: spec.DiskMiB, Env: spec.Env, Cwd: spec.Cwd, Egress: spec.Egress, Image: spec.Image,
		})
	}
	s.mu.Lock()
	if err != nil {
		e.rec.Error = why + " and it could not be restarted: " + err.Error()
		if serr := s.setStatus(e, StatusError); serr != nil { // after setting Error: the error event says it
			s.log.Warn("mark a sandbox error", "sandbox", e.rec.ID, "err", serr)
		}
	} else {
		hj, _ := json.Marshal(nh)
		e.handle, e.rec.Handle = nh, hj
		e.lostState = fmt.Sprintf("%s and it was restarted at %s: its interpreter's state is lost, its files are kept; the code did not run",
			why, time.Now().UTC().Format(time.RFC3339))
	}
	rec := e.rec
	s.mu.Unlock()
	if err := s.cfg.Store.Put(context.WithoutCancel(ctx), rec); err != nil {
		s.log.Warn("save sandbox record", "sandbox", rec.ID, "err", err)
	}
	if err == nil {
		s.emit(events.Event{Type: events.Restarted, Sandbox: rec.ID, Family: rec.FamilyID, Status: rec.Status, Reason: reason})
	}
	return rec, err
}
