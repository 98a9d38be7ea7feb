package sandbox

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"os"
	"path/filepath"
	"sort"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ramify-dev/ramify/internal/agent"
	"github.com/ramify-dev/ramify/internal/crashpoint"
	"github.com/ramify-dev/ramify/internal/errdefs"
	"github.com/ramify-dev/ramify/internal/events"
	"github.com/ramify-dev/ramify/internal/layertar"
	"github.com/ramify-dev/ramify/internal/runtime"
	"github.com/ramify-dev/ramify/internal/snapstore"
	"github.com/ramify-dev/ramify/internal/store"
)

// A pause writes a snapshot to the snapshot store and frees the host: three objects under one key prefix,
//
//	session.bin    the interpreter's session as a session stream (see repl.py): one dill pickle per variable,
//	               large numpy arrays as raw out-of-band buffers, plus cwd, env, execution count
//	layer.tar      the sandbox's writable layer (its overlay upper directory)
//	manifest.json  the sandbox's spec, what could not be saved, and the size and SHA-256 of the other two
//
// The session goes from the interpreter's memory through a pipe straight into the store: nothing of it touches
// the sandbox's disk. The manifest is written last: a snapshot without one is incomplete and never resumed. A
// resume checks every part against the manifest as it streams it in, so a corrupt or missing part fails the
// resume with a clear error and leaves the snapshot untouched. (Snapshots made before session streams hold a
// session.tar of pickle files instead; resume still reads them.)

// sessionDir is where, inside the sandbox, an older snapshot's session.tar is unpacked for the interpreter.
const sessionDir = "/.ramify-session"

// PauseInfo is what the last pause and resume reported (the sandbox's "pause" field).
type PauseInfo struct {
	NotSaved      []agent.Skipped `json:"not_saved,omitempty"`
	NotRestored   []agent.Skipped `json:"not_restored,omitempty"`
	SnapshotBytes int64           `json:"snapshot_bytes,omitempty"`
	PauseMs       float64         `json:"pause_ms,omitempty"`
	ResumeMs      float64         `json:"resume_ms,omitempty"`
	PausedAt      *time.Time      `json:"paused_at,omitempty"`
	Error         string          `json:"error,omitempty"`
}

// Part is one object of a snapshot.
type Part struct {
	Size   int64  `json:"size"`
	SHA256 string `json:"sha256"`
}

// Manifest describes a snapshot.
type Manifest struct {
	Version   int                `json:"version"`
	Sandbox   string             `json:"sandbox"`
	CreatedAt time.Time          `json:"created_at"`
	Spec      json.RawMessage    `json:"spec"`
	Parts     map[string]Part    `json:"parts"`
	NotSaved  []agent.Skipped    `json:"not_saved"`
	Extra     map[string]float64 `json:"extra,omitempty"`
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
func (s *Service) startLifecycle(ctx context.Context, id string, op Op, done, busy Status, ready func(*entry) error, work func(*entry)) (Info, bool, error) {
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
	s.setStatus(e, busy) //nolint:errcheck // admitted above; e is held exclusively
	in := s.info(e)
	s.mu.Unlock()
	// The work holds e until it is finished; it runs on the service's context, which Close cancels.
	go func() {
		defer s.wg.Done()
		defer release()
		work(e)
	}()
	return in, true, nil
}

// pauseOnTimeout is the timeout action for on_timeout "pause": it waits for the pause to finish.
func (s *Service) pauseOnTimeout(ctx context.Context, id string) error {
	_, _, err := s.Pause(ctx, id)
	return err
}

// pause does the work on the service's context (Close cancels it: the pause then fails and rolls back); the
// caller holds e.op exclusively.
func (s *Service) pause(e *entry) {
	ctx := s.ctx
	start := time.Now()
	s.mu.Lock()
	h, id, specJSON := e.handle, e.rec.ID, e.rec.Spec
	s.mu.Unlock()
	fk, _ := s.cfg.Runtime.(runtime.Forker)
	prefix := fmt.Sprintf("%s/%d/", id, time.Now().UnixNano())
	fail := func(err error) {
		s.log.Warn("pause failed; the sandbox keeps running", "sandbox", id, "err", err)
		// Undoing must happen even when the failure is Close's cancellation.
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), rollbackTimeout)
		defer cancel()
		if err := s.cfg.Snapshots.Delete(ctx, prefix); err != nil { // what was written of the snapshot
			s.log.Warn("pause failed: delete the partial snapshot", "sandbox", id, "err", err)
		}
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
	if fk == nil {
		fail(errors.New("this runtime cannot pause sandboxes"))
		return
	}
	c, err := s.cfg.Runtime.Agent(id)
	if err != nil {
		fail(err)
		return
	}
	session, notSaved, err := s.saveSession(ctx, c, prefix+"session.bin")
	if err != nil {
		fail(fmt.Errorf("save the interpreter: %w", err))
		return
	}
	s.log.Debug("pause phase", "sandbox", id, "phase", "session saved", "ms", ms(time.Since(start)))
	crashpoint.Hit(crashpoint.PauseAfterSession)
	if err := fk.Freeze(ctx, h); err != nil {
		fail(fmt.Errorf("freeze: %w", err))
		return
	}
	m := Manifest{Version: 1, Sandbox: id, CreatedAt: time.Now().UTC(), Spec: specJSON,
		Parts: map[string]Part{"session.bin": session}, NotSaved: notSaved}
	layerPart, err := s.putTar(ctx, prefix+"layer.tar", fk.UpperDir(h), nil)
	if err != nil {
		fail(fmt.Errorf("write layer.tar: %w", err))
		return
	}
	m.Parts["layer.tar"] = layerPart
	s.log.Debug("pause phase", "sandbox", id, "phase", "layer saved", "ms", ms(time.Since(start)))
	crashpoint.Hit(crashpoint.PauseAfterLayer)
	mb, _ := json.MarshalIndent(m, "", "  ")
	if _, err := s.cfg.Snapshots.Put(ctx, prefix+"manifest.json", bytesReader(mb)); err != nil {
		fail(fmt.Errorf("write manifest: %w", err))
		return
	}
	// The snapshot is complete: free the host, then record it. (A crash in between leaves a "pausing" record
	// whose sandbox is gone: the next start sees its snapshot and marks it paused.) From here on the pause is
	// committed and finishes even if Close cancels.
	ctx = context.WithoutCancel(ctx)
	s.mu.Lock()
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
	s.mu.Lock()
	old := prev
	if err := s.setStatus(e, StatusPaused); err != nil {
		s.log.Error("pause", "sandbox", id, "err", err)
	}
	e.rec.Snapshot = prefix
	e.rec.Handle = nil
	e.handle = runtime.Handle{}
	var size int64
	for _, p := range m.Parts {
		size += p.Size
	}
	s.setPauseInfo(e, PauseInfo{NotSaved: m.NotSaved, SnapshotBytes: size, PauseMs: ms(time.Since(start)), PausedAt: &now})
	rec := e.rec
	// Under s.mu with the status change: whoever sees the sandbox paused can find the event.
	s.emit(events.Event{Type: events.Paused, Sandbox: id, Family: rec.FamilyID, Status: string(StatusPaused),
		Bytes: size, Ms: msSince(start)})
	s.mu.Unlock()
	if err := s.cfg.Store.Put(ctx, rec); err != nil {
		s.log.Error("pause: record the snapshot", "sandbox", id, "err", err)
	}
	if old != "" && old != prefix {
		s.cfg.Snapshots.Delete(ctx, old) //nolint:errcheck // superseded
	}
	s.log.Info("sandbox paused", "sandbox", id, "bytes", size, "ms", time.Since(start).Milliseconds(), "not_saved", len(m.NotSaved))
}

// snapshotBytes is the size of a snapshot's parts.
func snapshotBytes(m Manifest) int64 {
	var n int64
	for _, p := range m.Parts {
		n += p.Size
	}
	return n
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

type bytesReaderT struct {
	b []byte
	i int
}

func (r *bytesReaderT) Read(p []byte) (int, error) {
	if r.i >= len(r.b) {
		return 0, io.EOF
	}
	n := copy(p, r.b[r.i:])
	r.i += n
	return n, nil
}

func bytesReader(b []byte) io.Reader { return &bytesReaderT{b: b} }

// newPipe returns a pipe with a 1 MiB buffer (fewer wake-ups when a session of gigabytes goes through it).
func newPipe() (r, w *os.File, err error) {
	r, w, err = os.Pipe()
	if err == nil {
		unix.FcntlInt(w.Fd(), unix.F_SETPIPE_SZ, 1<<20) //nolint:errcheck // a smaller pipe only costs speed
	}
	return r, w, err
}

// saveSession has the interpreter write its session as a session stream into a pipe whose other end goes
// straight into the snapshot store under key. It returns the stored part and what could not be saved.
func (s *Service) saveSession(ctx context.Context, c *agent.Client, key string) (Part, []agent.Skipped, error) {
	pr, pw, err := newPipe()
	if err != nil {
		return Part{}, nil, err
	}
	type put struct {
		obj snapstore.Object
		err error
	}
	done := make(chan put, 1)
	go func() {
		obj, err := s.cfg.Snapshots.Put(ctx, key, pr)
		pr.Close() // a failed store stops the interpreter's writes (EPIPE)
		done <- put{obj, err}
	}()
	skipped, err := c.SnapshotSession(ctx, pw)
	p := <-done
	if err != nil {
		return Part{}, nil, err
	}
	if p.err != nil {
		return Part{}, nil, fmt.Errorf("write session.bin: %w", p.err)
	}
	return Part{Size: p.obj.Size, SHA256: p.obj.SHA256}, skipped, nil
}

// fileOpener is a snapshot store that can hand out an object's file (the local store).
type fileOpener interface {
	OpenFile(ctx context.Context, key string) (*os.File, error)
}

// loadSession has the interpreter load the snapshot's session.bin while the server checks its size and SHA-256
// against the manifest; a mismatch fails the load (the caller then discards the sandbox). From a local store the
// interpreter gets the file itself (read-only) and reads it with direct I/O while the server hashes it
// alongside; from any other store the part streams through a pipe, hashed on the way.
func (s *Service) loadSession(ctx context.Context, c *agent.Client, prefix string, m Manifest) ([]agent.Skipped, error) {
	want := m.Parts["session.bin"]
	key := prefix + "session.bin"
	rc, err := s.cfg.Snapshots.Get(ctx, key)
	if err != nil {
		return nil, fmt.Errorf("snapshot part session.bin is missing: %w", err)
	}
	var give, pw *os.File
	if fo, ok := s.cfg.Snapshots.(fileOpener); ok {
		give, err = fo.OpenFile(ctx, key)
	} else {
		give, pw, err = newPipe()
	}
	if err != nil {
		rc.Close()
		return nil, fmt.Errorf("snapshot part session.bin: %w", err)
	}
	done := make(chan error, 1)
	go func() {
		defer rc.Close()
		h := sha256.New()
		var n int64
		var werr error
		if pw != nil {
			n, werr = copyHashed(pw, rc, h)
			pw.Close()
		} else {
			n, werr = copyHashed(io.Discard, rc, h)
		}
		if err := checkPart("session.bin", n, h, want); err != nil {
			done <- err
			return
		}
		if werr != nil && !errors.Is(werr, errReaderGone) {
			done <- werr
			return
		}
		done <- nil
	}()
	skipped, err := c.RestoreSession(ctx, give)
	if cerr := <-done; cerr != nil {
		return skipped, cerr // the cause, when the interpreter choked on a corrupt stream
	}
	return skipped, err
}

var errReaderGone = errors.New("the interpreter stopped reading")

// copyHashed copies r to w through h with a large buffer. When w fails (the interpreter stopped reading) it
// goes on reading r into h, so that the caller can still tell a corrupt part from a refused one.
func copyHashed(w io.Writer, r io.Reader, h io.Writer) (int64, error) {
	buf := make([]byte, 1<<20)
	var n int64
	var werr error
	for {
		k, err := r.Read(buf)
		if k > 0 {
			h.Write(buf[:k])
			n += int64(k)
			if werr == nil {
				if _, err := w.Write(buf[:k]); err != nil {
					werr = errReaderGone
				}
			}
		}
		if err == io.EOF {
			return n, werr
		}
		if err != nil {
			return n, err
		}
	}
}

// putTar streams a tar of dir into the snapshot store.
func (s *Service) putTar(ctx context.Context, key, dir string, skip func(string) bool) (Part, error) {
	if _, err := os.Stat(dir); err != nil {
		return Part{}, err
	}
	pr, pw := io.Pipe()
	go func() {
		_, err := layertar.Write(pw, dir, skip)
		pw.CloseWithError(err)
	}()
	obj, err := s.cfg.Snapshots.Put(ctx, key, pr)
	pr.CloseWithError(err)
	if err != nil {
		return Part{}, err
	}
	return Part{Size: obj.Size, SHA256: obj.SHA256}, nil
}

// Resume starts resuming a paused (or failed) sandbox. accepted is false when it was already running.
func (s *Service) Resume(ctx context.Context, id string) (info Info, accepted bool, err error) {
	hasSnapshot := func(e *entry) error {
		if e.rec.Snapshot == "" {
			return errdefs.New(errdefs.ErrConflict, "sandbox is not paused or in error (it has no snapshot to resume)")
		}
		return s.admitLocked(e.spec, 1) // called under s.mu
	}
	return s.startLifecycle(ctx, id, OpResume, StatusRunning, StatusResuming, hasSnapshot, s.resume)
}

// resume does the work on the service's context (Close cancels it: the resume then fails, the snapshot is
// kept); the caller holds e.op exclusively.
func (s *Service) resume(e *entry) {
	ctx := s.ctx
	start := time.Now()
	s.mu.Lock()
	id, prefix, spec, ipStr, hostname := e.rec.ID, e.rec.Snapshot, e.spec, e.rec.IP, e.rec.Hostname
	s.mu.Unlock()
	fail := func(err error) {
		s.log.Warn("resume failed; the snapshot is kept, resume may be retried", "sandbox", id, "err", err)
		ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), rollbackTimeout)
		defer cancel()
		s.mu.Lock()
		e.rec.Error = "resume failed: " + errdefs.Message(err) // before setStatus: the error event says it
		if err := s.setStatus(e, StatusError); err != nil {
			s.log.Error("resume failed", "sandbox", id, "err", err)
		}
		rec := e.rec
		s.mu.Unlock()
		s.cfg.Store.Put(ctx, rec) //nolint:errcheck
	}
	m, err := s.readManifest(ctx, prefix)
	if err != nil {
		fail(err)
		return
	}
	_, streamed := m.Parts["session.bin"]
	// Nothing of this id may exist while it is paused; clear what a crash may have left (a layer, a cgroup).
	s.cfg.Runtime.Destroy(ctx, runtime.Handle{ID: id}) //nolint:errcheck // usually there is nothing to remove
	ip := parseIP(ipStr)
	h, err := s.cfg.Runtime.Create(ctx, runtime.Spec{
		ID: id, Hostname: hostname, IP: ip, VCPU: spec.VCPU, MemMiB: spec.MemMiB, MaxProcs: spec.MaxProcs,
		DiskMiB: spec.DiskMiB, Env: spec.Env, Cwd: spec.Cwd,
		Egress: spec.Egress,
		Populate: func(upper string) error {
			if err := s.extractPart(ctx, prefix, "layer.tar", m, upper); err != nil {
				return err
			}
			if streamed {
				return nil
			}
			sd := filepath.Join(upper, sessionDir)
			if err := os.Mkdir(sd, 0o700); err != nil {
				return err
			}
			os.Lchown(sd, s.cfg.HostUID, s.cfg.HostGID) //nolint:errcheck // extract sets what the tar says
			return s.extractPart(ctx, prefix, "session.tar", m, sd)
		},
	})
	if err != nil {
		fail(err)
		return
	}
	s.log.Debug("resume phase", "sandbox", id, "phase", "sandbox created", "ms", ms(time.Since(start)))
	crashpoint.Hit(crashpoint.ResumeAfterCreate)
	c, err := s.cfg.Runtime.Agent(id)
	var notRestored []agent.Skipped
	switch {
	case err != nil:
	case streamed:
		notRestored, err = s.loadSession(ctx, c, prefix, m)
	default:
		notRestored, err = c.RestoreSessionDir(ctx, sessionDir)
		if err == nil {
			_, err = c.Exec(ctx, agent.ExecRequest{Argv: []string{"rm", "-rf", sessionDir}}, nil)
		}
	}
	if err != nil {
		s.cfg.Runtime.Destroy(context.WithoutCancel(ctx), h) //nolint:errcheck // undo the half-resumed sandbox
		fail(fmt.Errorf("restore the interpreter: %w", err))
		return
	}
	ctx = context.WithoutCancel(ctx) // the sandbox runs: record it even if Close cancels now
	s.log.Debug("resume phase", "sandbox", id, "phase", "interpreter restored", "ms", ms(time.Since(start)))
	hj, _ := json.Marshal(h)
	s.mu.Lock()
	e.handle = h
	e.rec.Handle = hj
	if err := s.setStatus(e, StatusRunning); err != nil {
		s.log.Error("resume", "sandbox", id, "err", err)
	}
	e.rec.Error = ""
	e.rec.FamilyID = h.FamilyID
	e.rec.Snapshot = ""
	pi := s.pauseInfo(e)
	pi.NotRestored, pi.ResumeMs, pi.Error = notRestored, ms(time.Since(start)), ""
	s.setPauseInfo(e, pi)
	rec := e.rec
	s.emit(events.Event{Type: events.Resumed, Sandbox: id, Family: rec.FamilyID, Status: string(StatusRunning),
		Bytes: snapshotBytes(m), Ms: msSince(start)}) // under s.mu with the status change, as paused
	s.mu.Unlock()
	if err := s.cfg.Store.Put(ctx, rec); err != nil {
		s.log.Error("resume: record", "sandbox", id, "err", err)
		return
	}
	s.cfg.Snapshots.Delete(ctx, prefix) //nolint:errcheck // the sandbox runs again; its snapshot is spent
	s.log.Info("sandbox resumed", "sandbox", id, "ms", time.Since(start).Milliseconds())
}

func (s *Service) readManifest(ctx context.Context, prefix string) (Manifest, error) {
	var m Manifest
	rc, err := s.cfg.Snapshots.Get(ctx, prefix+"manifest.json")
	if err != nil {
		return m, fmt.Errorf("snapshot %s has no manifest: %w", prefix, err)
	}
	defer rc.Close()
	b, err := io.ReadAll(io.LimitReader(rc, 16<<20))
	if err != nil {
		return m, fmt.Errorf("read manifest: %w", err)
	}
	if err := json.Unmarshal(b, &m); err != nil || m.Version != 1 {
		return m, errdefs.New(errdefs.ErrInvalid, fmt.Sprintf("snapshot %s: corrupt manifest", prefix))
	}
	return m, nil
}

// extractPart streams a part into dir, checking its size and SHA-256 against the manifest.
func (s *Service) extractPart(ctx context.Context, prefix, name string, m Manifest, dir string) error {
	want, ok := m.Parts[name]
	if !ok {
		return errdefs.New(errdefs.ErrInvalid, fmt.Sprintf("snapshot %s: manifest lists no %s", prefix, name))
	}
	rc, err := s.cfg.Snapshots.Get(ctx, prefix+name)
	if err != nil {
		return fmt.Errorf("snapshot part %s is missing: %w", name, err)
	}
	defer rc.Close()
	h := sha256.New()
	cr := &countingReader{r: io.TeeReader(rc, h)}
	_, xerr := layertar.Extract(cr, dir)
	// Read the rest (tar padding after the end marker counts too; after a failed extract, it tells a corrupt
	// part from a bad one).
	io.Copy(io.Discard, cr) //nolint:errcheck
	if err := checkPart(name, cr.n, h, want); err != nil {
		return err
	}
	if xerr != nil {
		return fmt.Errorf("snapshot part %s: %w", name, xerr)
	}
	return nil
}

// checkPart compares n bytes read with SHA-256 state h against what the manifest says of part name.
func checkPart(name string, n int64, h hash.Hash, want Part) error {
	if got := hex.EncodeToString(h.Sum(nil)); n != want.Size || got != want.SHA256 {
		return errdefs.New(errdefs.ErrInvalid, fmt.Sprintf("snapshot part %s is corrupt: %d bytes with sha256 %s, manifest says %d bytes with sha256 %s", name, n, got, want.Size, want.SHA256))
	}
	return nil
}

type countingReader struct {
	r io.Reader
	n int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

// forkPaused makes n new sandboxes from a byte-identical copy of a paused sandbox's snapshot, all or nothing:
// every child's snapshot is copied, then every child's record is written in one transaction (the commit point);
// a failure before that undoes what was done. The children are paused; unless startPaused, each then resumes
// (in the background: a failed resume leaves that child in error, like any resume). The caller holds e.
// A non-nil egress gives the children that egress list instead of the parent's.
func (s *Service) forkPaused(ctx context.Context, e *entry, n int, startPaused bool, egress *[]string) (ForkResult, error) {
	s.mu.Lock()
	parent := e.rec
	spec := e.spec
	s.mu.Unlock()
	childSpec := parent.Spec
	if egress != nil {
		spec.Egress = *egress
		childSpec, _ = json.Marshal(spec)
	}
	out := ForkResult{Note: "forked from a paused sandbox's snapshot: each child is an independent sandbox with its own id and address"}
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
