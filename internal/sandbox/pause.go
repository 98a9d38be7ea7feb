package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ramify-dev/ramify/internal/agent"
	"github.com/ramify-dev/ramify/internal/crashpoint"
	"github.com/ramify-dev/ramify/internal/errdefs"
	"github.com/ramify-dev/ramify/internal/events"
	"github.com/ramify-dev/ramify/internal/runtime"
)

// PauseInfo is what the last pause and resume reported (the sandbox's "pause" field).
type PauseInfo struct {
	NotSaved      []agent.Skipped `json:"not_saved,omitempty"`
	NotRestored   []agent.Skipped `json:"not_restored,omitempty"`
	SnapshotBytes int64           `json:"snapshot_bytes,omitempty"`
	PauseMs       float64         `json:"pause_ms,omitempty"`
	ResumeMs      float64         `json:"resume_ms,omitempty"`
	PausedAt      *time.Time      `json:"paused_at,omitempty"`
	// Error is why the last pause failed (the sandbox runs on) or why the last resume failed (it is paused
	// again, its snapshot intact); cleared as the next pause or resume begins.
	Error string `json:"error,omitempty"`
	// Warning is set by a resume whose restored files take more than the sandbox's disk_mib (a snapshot of
	// an older version): the sandbox runs over its quota and its writes fail until it frees space.
	Warning string `json:"warning,omitempty"`
	// Preload, kept with the record and not shown by the API, lists the packages the paused session imports
	// as it loads (Manifest.Preload): keepResumesReady has the runtime keep them imported ahead for its resume.
	Preload []string `json:"preload,omitempty"`
}

// PollAfter is the suggested wait before the first status poll after a pause or resume is accepted.
const PollAfter = time.Second

func (s *Service) pauseInfo(e *entry) PauseInfo {
	var pi PauseInfo
	json.Unmarshal(e.rec.Pause, &pi) //nolint:errcheck // written by us
	return pi
}

func (s *Service) setPauseInfo(e *entry, pi PauseInfo) {
	b, _ := json.Marshal(pi)
	e.rec.Pause = b
}

func (s *Service) snapshots() error {
	if s.cfg.Snapshots == nil {
		return errdefs.New(errdefs.ErrConflict, "no snapshot store is configured")
	}
	return nil
}

// Pause starts pausing a running sandbox. accepted is false when it was already paused (nothing to do).
func (s *Service) Pause(ctx context.Context, id string) (info Info, accepted bool, err error) {
	return s.startLifecycle(ctx, id, OpPause, StatusPaused, StatusPausing, nil, s.pause)
}

// startLifecycle begins a pause or a resume: it takes the sandbox exclusively and, unless it already is in
// status done (then it answers at once, accepted false), checks op against the state table and ready (if set),
// records status busy, and runs work in the background, which holds the sandbox until it is finished: other
// calls wait, then see the outcome.
func (s *Service) startLifecycle(ctx context.Context, id string, op Op, done, busy Status, ready func(*entry) error, work func(context.Context, *entry)) (Info, bool, error) {
	if err := s.snapshots(); err != nil {
		return Info{}, false, err
	}
	e, err := s.lookup(id)
	if err != nil {
		return Info{}, false, err
	}
	var already *Info
	release, err := s.acquireEntries(exclusive, func(e *entry) error {
		st := Status(e.rec.Status)
		if st == done {
			in := s.info(e)
			already = &in
			return nil
		}
		if err := check(op, st); err != nil {
			return err
		}
		if ready != nil {
			if err := ready(e); err != nil {
				return err
			}
		}
		if err := transition(e.rec.ID, st, busy); err != nil {
			return err
		}
		// Counted now, under s.mu, so that Close either waits for the work or refuses it before it starts.
		if !s.enterLocked() {
			return errClosing
		}
		return nil
	}, e)
	if err != nil {
		return Info{}, false, err
	}
	if already != nil {
		release()
		return *already, false, nil
	}
	s.mu.Lock()
	rec := e.rec
	rec.Status = string(busy) // applied in memory once saved
	s.mu.Unlock()
	if err := s.cfg.Store.Put(ctx, rec); err != nil {
		s.wg.Done()
		release()
		return Info{}, false, err
	}
	s.mu.Lock()
	switch op {
	case OpPause:
		// A new pause: the last one's failure no longer describes the sandbox (and a wait for paused must not
		// end on it: see pauseFailed).
		if pi := s.pauseInfo(e); pi.Error != "" {
			pi.Error = ""
			s.setPauseInfo(e, pi)
		}
	case OpResume:
		// The last resume's failure (error field: a broken snapshot; pause.error: any other), which this one
		// replaces (and a wait for running must not end on it: see resumeFailed).
		e.rec.Error = ""
		if pi := s.pauseInfo(e); pi.Error != "" {
			pi.Error = ""
			s.setPauseInfo(e, pi)
		}
	}
	s.setStatus(e, busy) //nolint:errcheck // admitted above; e is held exclusively
	in := s.info(e)
	// The work holds e until it is finished; it runs on the service's context, which Close cancels, and a
	// delete of the sandbox too (e.abort).
	wctx, abort := context.WithCancelCause(s.ctx)
	e.abort = abort
	s.mu.Unlock()
	go func() {
		defer s.wg.Done()
		defer release()
		defer func() {
			s.mu.Lock()
			e.abort = nil
			s.mu.Unlock()
			abort(nil)
		}()
		work(wctx, e)
	}()
	return in, true, nil
}

// pauseOnTimeout is the timeout action for on_timeout "pause": it waits for the pause to finish.
func (s *Service) pauseOnTimeout(ctx context.Context, id string) error {
	_, _, err := s.Pause(ctx, id)
	return err
}

// pause does the work on the service's context (Close cancels it: the pause then fails and rolls back); the
// caller holds e.op exclusively. Its phases: write the snapshot (writeSnapshot), then commit (commitPause); a
// failure before the commit rolls back (failPause) and the sandbox keeps running.
func (s *Service) pause(ctx context.Context, e *entry) {
	start := time.Now()
	s.mu.Lock()
	h, id, specJSON, spec := e.handle, e.rec.ID, e.rec.Spec, e.spec
	p := newProgress("session")
	e.prog = p
	s.mu.Unlock()
	defer s.endProgress(e, p)
	ctx = withProgress(ctx, p)
	prefix := fmt.Sprintf("%s/%d/", id, time.Now().UnixNano())
	fk, ok := s.cfg.Runtime.(runtime.Forker)
	if !ok {
		s.failPause(e, h, nil, prefix, errors.New("this runtime cannot pause sandboxes"))
		return
	}
	m, err := s.writeSnapshot(ctx, fk, h, id, prefix, specJSON, spec, start)
	if err != nil {
		var kept *saveKeptError
		keptMem := errors.As(err, &kept)
		err = stoppedBy(ctx, err)
		s.failPause(e, h, fk, prefix, err)
		if keptMem && !errors.Is(err, errDeleted) {
			s.restartKeptSave(e, h, kept)
		}
		return
	}
	s.commitPause(e, h, prefix, m, start)
}

// writeSnapshot writes a running sandbox's snapshot under prefix: the interpreter's session (while it runs),
// then, frozen, its layer, then the manifest that makes the snapshot complete. The sandbox is left frozen.
// A layer whose files hold more data than its quota of spec.DiskMiB (0: none) is refused: the quota counts blocks,
// and a layer of reflinked copies (cp reflinks by default) or of files btrfs compressed holds more data than
// blocks; stored, it would take the store more than the quota (without bound: a thousand copies of one file),
// and could not be restored under the quota.
func (s *Service) writeSnapshot(ctx context.Context, fk runtime.Forker, h runtime.Handle, id, prefix string,
	specJSON []byte, spec CreateRequest, start time.Time) (Manifest, error) {
	diskMiB := spec.DiskMiB
	c, err := s.cfg.Runtime.Agent(id)
	if err != nil {
		return Manifest{}, err
	}
	session, err := s.saveSession(ctx, c, h, spec, prefix+"session.bin")
	if err != nil {
		return Manifest{}, fmt.Errorf("save the interpreter: %w", err)
	}
	if rp, ok := s.cfg.Runtime.(runtime.ResumePreparer); ok && len(session.preload) > 0 {
		rp.PrepareResume(session.preload) // its resume will need them: the runtime may import them ahead
	}
	s.log.Debug("pause phase", "sandbox", id, "phase", "session saved", "ms", ms(time.Since(start)))
	progressOf(ctx).setPhase("files")
	crashpoint.Hit(crashpoint.PauseAfterSession)
	if err := fk.Freeze(ctx, h); err != nil {
		return Manifest{}, fmt.Errorf("freeze: %w", err)
	}
	m := Manifest{Version: 1, Sandbox: id, CreatedAt: time.Now().UTC(), Spec: specJSON,
		Parts: map[string]Part{"session.bin": session.part}, NotSaved: session.notSaved, Preload: session.preload}
	layerPart, err := s.putTar(ctx, prefix+"layer.tar", fk.UpperDir(h), nil, int64(diskMiB)<<20)
	if errors.Is(err, unix.EDQUOT) {
		err = fmt.Errorf("the sandbox's files hold more data than its disk quota (disk_mib %d) once written out: "+
			"reflinked copies (cp's default) and compressed files count in full in a snapshot: %w", diskMiB, err)
	}
	if err != nil {
		return Manifest{}, fmt.Errorf("write layer.tar: %w", err)
	}
	m.Parts["layer.tar"] = layerPart
	s.log.Debug("pause phase", "sandbox", id, "phase", "layer saved", "ms", ms(time.Since(start)))
	progressOf(ctx).setPhase("commit")
	crashpoint.Hit(crashpoint.PauseAfterLayer)
	mb, _ := json.MarshalIndent(m, "", "  ")
	if _, err := s.cfg.Snapshots.Put(ctx, prefix+"manifest.json", bytesReader(mb)); err != nil {
		return Manifest{}, fmt.Errorf("write manifest: %w", err)
	}
	return m, nil
}

// stoppedBy returns err of a pause or resume whose context ended with a cause (a delete: errDeleted) as that
// cause, err in parentheses, so that its callers can tell (errors.Is) and users read why it stopped.
func stoppedBy(ctx context.Context, err error) error {
	if c := context.Cause(ctx); c != nil && ctx.Err() != nil {
		return fmt.Errorf("%w (%v)", c, err)
	}
	return err
}

// restartKeptSave restarts the processes of sandbox e (handle h, running, held exclusively) in namespaces of
// their own on its files, after a save (a pause, a template's capture) whose copy left memory charged outside
// the sandbox's limit that the sandbox's processes or namespaces hold (saveKeptError): that memory goes only with
// them. The interpreter's state is lost (the next run_code says why); a sandbox that cannot be restarted is
// error.
func (s *Service) restartKeptSave(e *entry, h runtime.Handle, kept *saveKeptError) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(s.ctx), 30*time.Second)
	defer cancel()
	why := fmt.Sprintf("%.1f MiB written by the session's own code as it was saved stayed outside the sandbox's mem_mib", float64(kept.kept)/(1<<20))
	hl, _ := s.cfg.Runtime.(runtime.Healer)
	rec, err := s.restartProcesses(ctx, hl, e, h, why, why)
	if err != nil {
		s.cfg.Runtime.Destroy(ctx, h) //nolint:errcheck // the memory must go with its holders
	}
	s.log.Warn("sandbox restarted: its save kept memory outside its limit", "sandbox", rec.ID, "kept_bytes", kept.kept, "err", err)
}

// failPause undoes a pause that failed before its commit: what was written of the snapshot is deleted, the
// sandbox thawed, and it is running again with the failure in its pause info. It runs even when the failure is
// Close's cancellation.
func (s *Service) failPause(e *entry, h runtime.Handle, fk runtime.Forker, prefix string, err error) {
	s.mu.Lock()
	id := e.rec.ID
	s.mu.Unlock()
	if errors.Is(err, errDeleted) {
		s.log.Info("pause stopped by a delete of the sandbox", "sandbox", id, "err", err)
	} else {
		s.log.Warn("pause failed; the sandbox keeps running", "sandbox", id, "err", err)
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(s.ctx), rollbackTimeout)
	defer cancel()
	// What was written of the snapshot goes in the background: a store that failed the pause may take long to
	// answer the delete too, and the sandbox is running again meanwhile (no record names that prefix).
	s.dropSnapshot(prefix)
	if fk != nil {
		fk.Thaw(ctx, h) //nolint:errcheck // best effort: it may not be frozen
	}
	s.mu.Lock()
	pi := s.pauseInfo(e)
	pi.Error = "pause failed: " + err.Error() // before setStatus: the pause_failed event says it
	s.setPauseInfo(e, pi)
	if err := s.setStatus(e, StatusRunning); err != nil {
		s.log.Error("pause failed", "sandbox", id, "err", err)
	}
	rec := e.rec
	s.mu.Unlock()
	s.cfg.Store.Put(ctx, rec) //nolint:errcheck // the in-memory state is right
}

// commitPause finishes a pause whose snapshot is complete: it records the snapshot, frees the host (the
// sandbox's processes, cgroup, network and layer), and marks the sandbox paused. (A crash in between leaves a
// "pausing" record whose sandbox is gone: the next start sees its snapshot and marks it paused.) It finishes even
// if Close cancels.
func (s *Service) commitPause(e *entry, h runtime.Handle, prefix string, m Manifest, start time.Time) {
	ctx := context.WithoutCancel(s.ctx)
	s.mu.Lock()
	id := e.rec.ID
	prev := e.rec.Snapshot
	e.rec.Snapshot = prefix
	rec0 := e.rec
	s.mu.Unlock()
	if err := s.cfg.Store.Put(ctx, rec0); err != nil {
		s.log.Error("pause: record the snapshot", "sandbox", id, "err", err)
	}
	s.log.Debug("pause phase", "sandbox", id, "phase", "snapshot recorded", "ms", ms(time.Since(start)))
	if err := s.cfg.Runtime.Destroy(ctx, h); err != nil {
		s.log.Warn("pause: free the sandbox", "sandbox", id, "err", err)
	}
	s.log.Debug("pause phase", "sandbox", id, "phase", "sandbox freed", "ms", ms(time.Since(start)))
	now := time.Now().UTC()
	size := snapshotBytes(m)
	s.mu.Lock()
	if err := s.setStatus(e, StatusPaused); err != nil {
		s.log.Error("pause", "sandbox", id, "err", err)
	}
	e.rec.Snapshot = prefix
	e.rec.Handle = nil
	e.handle = runtime.Handle{}
	s.setPauseInfo(e, PauseInfo{NotSaved: m.NotSaved, SnapshotBytes: size, PauseMs: ms(time.Since(start)), PausedAt: &now,
		Preload: m.Preload})
	rec := e.rec
	// Under s.mu with the status change: whoever sees the sandbox paused can find the event.
	s.emit(events.Event{Type: events.Paused, Sandbox: id, Family: rec.FamilyID, Status: string(StatusPaused),
		Bytes: size, Ms: msSince(start)})
	s.mu.Unlock()
	if err := s.cfg.Store.Put(ctx, rec); err != nil {
		s.log.Error("pause: record the snapshot", "sandbox", id, "err", err)
	}
	if prev != "" && prev != prefix {
		s.dropSnapshot(prev) // superseded
	}
	s.log.Info("sandbox paused", "sandbox", id, "bytes", size, "ms", time.Since(start).Milliseconds(), "not_saved", len(m.NotSaved))
}

// resumeReadyInterval is how often keepResumesReady reminds the runtime of what paused sessions import: well
// within the runtime's own hold of such a reminder (10 minutes in the namespaces runtime).
const resumeReadyInterval = 4 * time.Minute

// keepResumesReady tells the runtime, as the service starts and then every resumeReadyInterval until Close,
// which packages the sessions of paused sandboxes import as they load (runtime.ResumePreparer). A resume finds
// an interpreter that imported them ready (numpy: ~115 ms of CPU less on its path) for as long as a sandbox may
// wait paused, hours for a person's answer, and after a restart, not only in the minutes after its pause.
func (s *Service) keepResumesReady(rp runtime.ResumePreparer) {
	t := time.NewTicker(resumeReadyInterval)
	defer t.Stop()
	for {
		for _, pkgs := range s.pausedPreloads() {
			rp.PrepareResume(pkgs)
		}
		select {
		case <-s.ctx.Done():
			return
		case <-t.C:
		}
	}
}

// pausedPreloads returns each distinct list of packages that paused sandboxes' sessions import as they load.
func (s *Service) pausedPreloads() [][]string {
	s.mu.Lock()
	defer s.mu.Unlock()
	seen := map[string]bool{}
	var out [][]string
	for _, e := range s.items {
		if Status(e.rec.Status) != StatusPaused {
			continue
		}
		pkgs := s.pauseInfo(e).Preload
		if key := strings.Join(pkgs, ","); len(pkgs) > 0 && !seen[key] {
			seen[key] = true
			out = append(out, pkgs)
		}
	}
	return out
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
