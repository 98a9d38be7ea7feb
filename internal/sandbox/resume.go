package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"time"

	"github.com/ramify-dev/ramify/internal/agent"
	"github.com/ramify-dev/ramify/internal/crashpoint"
	"github.com/ramify-dev/ramify/internal/errdefs"
	"github.com/ramify-dev/ramify/internal/events"
	"github.com/ramify-dev/ramify/internal/runtime"
	"github.com/ramify-dev/ramify/internal/store"
)

// Resume starts resuming a paused (or failed) sandbox. accepted is false when it was already running.
func (s *Service) Resume(ctx context.Context, id string) (info Info, accepted bool, err error) {
	hasSnapshot := func(e *entry) error {
		if e.rec.Snapshot == "" {
			return errdefs.New(errdefs.ErrConflict, "sandbox is not paused or in error (it has no snapshot to resume)")
		}
		if err := s.imageForResume(e.spec.Image); err != nil {
			return err
		}
		return s.admitLocked(e.spec, 1) // called under s.mu
	}
	return s.startLifecycle(ctx, id, OpResume, StatusRunning, StatusResuming, hasSnapshot, s.resume)
}

// resume does the work on the service's context (Close cancels it: the resume then fails, the snapshot is kept);
// the caller holds e.op exclusively. Its phases: bring the sandbox back from its snapshot (restore), then commit
// (commitResume); a failure leaves the sandbox as it was, paused with its snapshot, unless the snapshot itself
// is broken (failResume).
func (s *Service) resume(ctx context.Context, e *entry) {
	start := time.Now()
	s.mu.Lock()
	id, prefix := e.rec.ID, e.rec.Snapshot
	p := newProgress("files")
	e.prog = p
	s.mu.Unlock()
	defer s.endProgress(e, p)
	ctx = withProgress(ctx, p)
	m, h, notRestored, err := s.restoreSnapshot(ctx, e, prefix, start, true)
	if err != nil {
		err = stoppedBy(ctx, err)
		s.failResume(e, err)
		return
	}
	warning := s.overQuotaWarning(e, h)
	s.commitResume(e, h, prefix, m, notRestored, warning, start)
	s.log.Info("sandbox resumed", "sandbox", id, "ms", time.Since(start).Milliseconds())
}

// brokenSnapshotError is a resume's failure that is the snapshot's own: its manifest or a part is missing, or
// does not match (a part's size or SHA-256 is not the manifest's, the manifest does not parse), or its
// layer.tar holds what this server refuses to restore. Trying again cannot help: the sandbox goes to error
// (with its snapshot kept, as it is). Every other failure (out of capacity, the store or the host's disk
// failing, the interpreter killed while it loads, a shutdown or a delete) leaves the sandbox paused.
type brokenSnapshotError struct{ err error }

func (e *brokenSnapshotError) Error() string { return e.err.Error() }
func (e *brokenSnapshotError) Unwrap() error { return e.err }

// snapshotFault marks err, from reading the snapshot (its manifest, a part), as the snapshot's own fault when
// it is: the snapshot functions report a missing object as errdefs.ErrNotFound and a mismatch or an unusable
// content as errdefs.ErrInvalid; a store that failed to answer, or a transfer cut short, is neither.
func snapshotFault(err error) error {
	if err != nil && (errors.Is(err, errdefs.ErrInvalid) || errors.Is(err, errdefs.ErrNotFound)) {
		return &brokenSnapshotError{err: err}
	}
	return err
}

// restoreLayerFactor bounds what a layer.tar of n bytes takes once restored, at 3/2 n: a tar stores a file's
// data in 512-byte blocks after a 512-byte header, the layers' btrfs in 4 KiB blocks plus its metadata (a file
// of 2049 bytes: 3 KiB in the tar, ~4.4 KiB restored); larger files take about what they hold. The runtime
// adds runtime.RestoreSlack.
const restoreLayerFactor = 1.5

// layerExtra is what restoring a layer.tar of tarBytes may write beyond a quota of diskMiB (0: none): nothing
// for a layer a pause of this version made (it stores no more file data than the quota), more for one an
// older version made, which stored reflinked copies and sparse files in full. Such a layer is restored whole,
// under a cap its snapshot's size bounds (the shared layer file system is not filled whatever the snapshot),
// rather than failing every resume; the sandbox then runs over its quota (overQuotaWarning).
func layerExtra(tarBytes int64, diskMiB int) int64 {
	if diskMiB <= 0 {
		return 0
	}
	return max(int64(float64(tarBytes)*restoreLayerFactor)-int64(diskMiB)<<20, 0)
}

// overQuotaWarning returns, for a sandbox just restored whose files take more than its disk quota (an older
// version's snapshot: layerExtra), what the resume tells its user: writes fail with EDQUOT until it frees space.
// "" when it is within its quota, has none, or the runtime does not account for disk.
func (s *Service) overQuotaWarning(e *entry, h runtime.Handle) string {
	s.mu.Lock()
	id, diskMiB := e.rec.ID, e.spec.DiskMiB
	s.mu.Unlock()
	if diskMiB <= 0 {
		return ""
	}
	u, err := s.cfg.Runtime.Usage(h)
	quota := int64(diskMiB) << 20
	if err != nil || u.DiskBytes <= quota {
		return ""
	}
	w := fmt.Sprintf("the restored files take %.1f MiB, more than the sandbox's disk_mib %d (its snapshot was made by an "+
		"older ramify version, which stored reflinked copies and sparse files in full): until it frees %.1f MiB, "+
		"writes fail with EDQUOT (disk quota exceeded) and a pause fails", float64(u.DiskBytes)/(1<<20), diskMiB,
		float64(u.DiskBytes-quota)/(1<<20))
	s.log.Warn("sandbox resumed over its disk quota", "sandbox", id, "disk_bytes", u.DiskBytes, "disk_mib", diskMiB)
	return w
}

// restore creates sandbox e afresh from the template snapshot under prefix (restoreSnapshot): a layer holding
// more than e's disk_mib fails it (a create from a template asking for less disk than the template's files).
func (s *Service) restore(ctx context.Context, e *entry, prefix string, start time.Time) (Manifest, runtime.Handle, []agent.Skipped, error) {
	return s.restoreSnapshot(ctx, e, prefix, start, false)
}

// restoreSnapshot creates sandbox e afresh from the snapshot under prefix (its own, or a template's: it only
// reads the snapshot): its layer extracted into a new one, its interpreter's session loaded into the new
// interpreter. With wholeLayer (a resume), a layer holding more than e's disk_mib (an older version's
// snapshot) is restored whole, under a cap its size bounds (layerExtra). On failure nothing of it is left
// running.
func (s *Service) restoreSnapshot(ctx context.Context, e *entry, prefix string, start time.Time, wholeLayer bool) (Manifest, runtime.Handle, []agent.Skipped, error) {
	s.mu.Lock()
	id, spec, ipStr, hostname := e.rec.ID, e.spec, e.rec.IP, e.rec.Hostname
	s.mu.Unlock()
	m, err := s.readManifest(ctx, prefix)
	if err != nil {
		return Manifest{}, runtime.Handle{}, nil, snapshotFault(err)
	}
	s.log.Debug("resume phase", "sandbox", id, "phase", "manifest read", "ms", ms(time.Since(start)))
	progressOf(ctx).setTotal(snapshotBytes(m))
	_, streamed := m.Parts["session.bin"]
	var extra int64
	if wholeLayer {
		extra = layerExtra(m.Parts["layer.tar"].Size, spec.DiskMiB)
	}
	// Nothing of this id may exist while it is paused; clear what a crash may have left (a layer, a cgroup).
	s.cfg.Runtime.Destroy(ctx, runtime.Handle{ID: id}) //nolint:errcheck // usually there is nothing to remove
	h, err := s.cfg.Runtime.Create(ctx, runtime.Spec{
		ID: id, Hostname: hostname, IP: parseIP(ipStr), VCPU: spec.VCPU, MemMiB: spec.MemMiB, MaxProcs: spec.MaxProcs,
		DiskMiB: spec.DiskMiB, Env: spec.Env, Cwd: spec.Cwd,
		Egress: spec.Egress, Image: spec.Image, Preload: m.Preload,
		// An older snapshot's session files are unpacked into the layer and removed once loaded: they were
		// never on the sandbox's disk, so they do not count against its quota. An older snapshot's layer may
		// hold more than the quota: it is restored whole (layerExtra).
		PopulateExtra: m.Parts["session.tar"].Size + extra,
		Populate: func(upper string) error {
			if err := s.extractPart(ctx, prefix, "layer.tar", m, upper); err != nil {
				return snapshotFault(err)
			}
			if streamed {
				return nil
			}
			sd := filepath.Join(upper, sessionDir)
			if err := os.Mkdir(sd, 0o700); err != nil {
				return err
			}
			os.Lchown(sd, s.cfg.HostUID, s.cfg.HostGID) //nolint:errcheck // extract sets what the tar says
			return snapshotFault(s.extractPart(ctx, prefix, "session.tar", m, sd))
		},
	})
	if err != nil {
		return Manifest{}, runtime.Handle{}, nil, err
	}
	s.log.Debug("resume phase", "sandbox", id, "phase", "sandbox created", "ms", ms(time.Since(start)))
	crashpoint.Hit(crashpoint.ResumeAfterCreate)
	progressOf(ctx).setPhase("session")
	c, err := s.cfg.Runtime.Agent(id)
	var notRestored []agent.Skipped
	switch {
	case err != nil:
	case streamed:
		notRestored, err = s.loadSession(ctx, c, prefix, m)
		err = snapshotFault(err)
	default:
		notRestored, err = c.RestoreSessionDir(ctx, sessionDir)
		if err == nil {
			_, err = c.Exec(ctx, agent.ExecRequest{Argv: []string{"rm", "-rf", sessionDir}}, nil)
		}
	}
	if err != nil {
		s.cfg.Runtime.Destroy(context.WithoutCancel(ctx), h) //nolint:errcheck // undo the half-resumed sandbox
		return Manifest{}, runtime.Handle{}, nil, fmt.Errorf("restore the interpreter: %w", err)
	}
	s.log.Debug("resume phase", "sandbox", id, "phase", "interpreter restored", "ms", ms(time.Since(start)))
	return m, h, notRestored, nil
}

// failResume undoes the status of a resume that failed (restore left nothing of it running). The sandbox is
// paused again, exactly as before the resume, with the reason in pause.error and a resume_failed event: its
// snapshot is intact and a later resume can succeed. Only a snapshot that is itself broken
// (brokenSnapshotError) puts the sandbox in error, with the reason in its error field; the snapshot is kept
// there too. It runs even when the failure is Close's cancellation.
func (s *Service) failResume(e *entry, err error) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(s.ctx), rollbackTimeout)
	defer cancel()
	var broken *brokenSnapshotError
	s.mu.Lock()
	id := e.rec.ID
	msg := "resume failed: " + errdefs.Message(err)
	switch {
	case errors.Is(err, errDeleted):
		s.log.Info("resume stopped by a delete of the sandbox", "sandbox", id, "err", err)
	case errors.As(err, &broken):
		s.log.Warn("resume failed: the snapshot is broken; it is kept, the sandbox is in error", "sandbox", id, "err", err)
	default:
		s.log.Warn("resume failed; the sandbox stays paused with its snapshot, resume may be retried", "sandbox", id, "err", err)
	}
	if broken != nil {
		e.rec.Error = msg // before setStatus: the error event says it
		if err := s.setStatus(e, StatusError); err != nil {
			s.log.Error("resume failed", "sandbox", id, "err", err)
		}
	} else {
		pi := s.pauseInfo(e)
		pi.Error = msg // before setStatus: the resume_failed event says it
		s.setPauseInfo(e, pi)
		if err := s.setStatus(e, StatusPaused); err != nil {
			s.log.Error("resume failed", "sandbox", id, "err", err)
		}
	}
	rec := e.rec
	s.mu.Unlock()
	if err := s.cfg.Store.Put(ctx, rec); err != nil {
		// The record still says resuming: the next start makes it paused (New), as it is here.
		s.log.Error("resume failed: record", "sandbox", id, "err", err)
	}
}

// commitResume records a resumed sandbox as running (even if Close cancels now) and drops its spent snapshot.
func (s *Service) commitResume(e *entry, h runtime.Handle, prefix string, m Manifest, notRestored []agent.Skipped, warning string, start time.Time) {
	ctx := context.WithoutCancel(s.ctx)
	hj, _ := json.Marshal(h)
	s.mu.Lock()
	id := e.rec.ID
	e.handle = h
	e.rec.Handle = hj
	if err := s.setStatus(e, StatusRunning); err != nil {
		s.log.Error("resume", "sandbox", id, "err", err)
	}
	e.rec.Error = ""
	e.rec.FamilyID = h.FamilyID
	e.rec.Snapshot = ""
	pi := s.pauseInfo(e)
	pi.NotRestored, pi.ResumeMs, pi.Error, pi.Preload, pi.Warning = notRestored, ms(time.Since(start)), "", nil, warning
	s.setPauseInfo(e, pi)
	rec := e.rec
	s.emit(events.Event{Type: events.Resumed, Sandbox: id, Family: rec.FamilyID, Status: string(StatusRunning),
		Bytes: snapshotBytes(m), Ms: msSince(start)}) // under s.mu with the status change, as paused
	s.mu.Unlock()
	if err := s.cfg.Store.Put(ctx, rec); err != nil {
		s.log.Error("resume: record", "sandbox", id, "err", err)
		return
	}
	s.dropSnapshot(prefix) // the sandbox runs again; its snapshot is spent
}

// dropSnapshot deletes a snapshot no record names any more (a resumed sandbox's spent one, one a newer pause
// superseded, a deleted sandbox's) in the background, off the sandbox's lifecycle: deleting a large file and
// syncing its directory takes ~1 s for 1 GiB on the machines we measured, and calls to a resumed sandbox, or a
// DELETE, waited for it. While the service closes it deletes it at once (Close waits for the caller's work).
// One the server does not get to (a crash) is reclaimed as it next starts (reclaimSnapshots: no record names it).
func (s *Service) dropSnapshot(prefix string) {
	drop := func() {
		ctx, cancel := context.WithTimeout(context.WithoutCancel(s.ctx), rollbackTimeout)
		defer cancel()
		if err := s.cfg.Snapshots.Delete(ctx, prefix); err != nil {
			s.log.Warn("delete a snapshot no record names (the next start reclaims it)", "snapshot", prefix, "err", err)
		}
	}
	if !s.goBackground(drop) {
		drop()
	}
}

// forkPaused makes n new sandboxes from a byte-identical copy of a paused sandbox's snapshot, all or nothing:
// every child's snapshot is copied, then every child's record is written in one transaction (the commit point);
// a failure before that undoes what was done. The children are paused; unless startPaused, each then resumes
// (in the background: a failed resume leaves that child in error, like any resume). The caller holds e.
// The options' overrides (egress, ingress_enabled) replace the parent's in the children's spec.
func (s *Service) forkPaused(ctx context.Context, e *entry, n int, startPaused bool, o ForkOptions) (ForkResult, error) {
	s.mu.Lock()
	parent := e.rec
	spec := e.spec
	s.mu.Unlock()
	childSpec := parent.Spec
	if o.apply(&spec) {
		childSpec, _ = json.Marshal(spec)
	}
	out := ForkResult{Note: "forked from a paused sandbox's snapshot: each child is an independent sandbox with its own id and address"}
	if !startPaused {
		// Each child resumes once made: refused for capacity, the children would stay paused where the caller
		// asked for running ones (and waits for them). Refused up front instead, as a fork of a running parent is.
		s.mu.Lock()
		err := s.admitLocked(spec, n)
		s.mu.Unlock()
		if err != nil {
			return ForkResult{}, fmt.Errorf("fork %s: %w", parent.ID, err)
		}
	}
	var undo undoStack
	fail := func(err error) (ForkResult, error) {
		return ForkResult{}, s.fail(ctx, &undo, fmt.Errorf("fork %s: %w", parent.ID, err))
	}
	m, err := s.readManifest(ctx, parent.Snapshot)
	if err != nil {
		return fail(err)
	}
	parts := make([]string, 0, len(m.Parts)+1)
	for name := range m.Parts {
		parts = append(parts, name)
	}
	sort.Strings(parts)
	parts = append(parts, "manifest.json") // the manifest last, as a pause writes it
	kids := make([]*entry, n)
	for i := range kids {
		cid := NewID()
		prefix := fmt.Sprintf("%s/%d/", cid, time.Now().UnixNano())
		undo.push("snapshot copy "+prefix, func(ctx context.Context) error { return s.cfg.Snapshots.Delete(ctx, prefix) })
		for _, part := range parts {
			if err := s.cfg.Snapshots.Copy(ctx, parent.Snapshot+part, prefix+part); err != nil {
				return fail(fmt.Errorf("copy snapshot: %w", err))
			}
		}
		kids[i] = &entry{spec: spec, rec: store.Record{ID: cid, Status: string(StatusPaused), FamilyID: "fam_" + cid[4:],
			ForkedFrom: parent.ID, Hostname: hostnameOf(cid), CreatedAt: time.Now().UTC(),
			Spec: childSpec, Snapshot: prefix, Pause: parent.Pause}}
	}
	crashpoint.Hit(crashpoint.ForkPausedAfterCopies)
	// The children are held until their records are saved: no call on one can start before it exists.
	var held []*entry
	releaseKids := func() {
		for _, k := range held {
			k.op.Unlock()
		}
		held = nil
	}
	defer releaseKids()
	recs := make([]store.Record, n)
	s.mu.Lock()
	for i, k := range kids {
		ip, err := s.allocateIP()
		if err != nil {
			s.mu.Unlock()
			return fail(err)
		}
		k.rec.IP = ip.String()
		k.op.Lock() // new: nobody else holds it
		held = append(held, k)
		s.items[k.rec.ID] = k // reserves the address
		recs[i] = k.rec
		undo.push("reserve "+k.rec.ID, func(context.Context) error {
			s.mu.Lock()
			defer s.mu.Unlock()
			s.retire(k)
			return nil
		})
	}
	s.mu.Unlock()
	if err := s.cfg.Store.PutMany(ctx, recs, nil); err != nil {
		return fail(err)
	}
	for _, k := range kids {
		out.Children = append(out.Children, k.rec.ID)
	}
	releaseKids()
	s.log.Info("paused sandbox forked", "sandbox", parent.ID, "n", n)
	s.emit(events.Event{Type: events.Forked, Sandbox: parent.ID, Family: parent.FamilyID, Status: string(StatusPaused),
		Children: out.Children, N: n})
	return out, nil
}

// resumeForked resumes the children of a fork of a paused sandbox (start_paused false). The caller no longer
// holds the parent: a resume takes its child exclusively, and another call holding that child while it waits
// for the parent (a merge, say) would otherwise deadlock with the fork.
func (s *Service) resumeForked(ctx context.Context, children []string) {
	for _, cid := range children {
		if _, _, err := s.Resume(ctx, cid); err != nil {
			s.log.Warn("fork of a paused sandbox: resume a child", "sandbox", cid, "err", err)
		}
	}
}
