package sandbox

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"hash"
	"io"
	"log/slog"
	"os"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ramify-dev/ramify/internal/agent"
	"github.com/ramify-dev/ramify/internal/errdefs"
	"github.com/ramify-dev/ramify/internal/layertar"
	"github.com/ramify-dev/ramify/internal/runtime"
	"github.com/ramify-dev/ramify/internal/snapstore"
)

// A pause writes a snapshot to the snapshot store and frees the host: three objects under one key prefix,
//
//	session.bin    the interpreter's session as a session stream (see repl.py): one pickle per variable (loaded
//	               without dill when it names nothing of dill's), large numpy arrays as raw out-of-band buffers,
//	               plus cwd, env, execution count
//	layer.tar      the sandbox's writable layer (its overlay upper directory)
//	manifest.json  the sandbox's spec, what could not be saved, and the size and checksum of the other two
//	               (CRC-32C; SHA-256 in snapshots of versions before it, which resume checks as such)
//
// The session goes from the interpreter's memory through a pipe straight into the store: nothing of it touches
// the sandbox's disk. The manifest is written last: a snapshot without one is incomplete and never resumed. A
// resume checks every part against the manifest as it streams it in, so a corrupt or missing part fails the
// resume with a clear error and leaves the snapshot untouched. (Snapshots made before session streams hold a
// session.tar of pickle files instead; resume still reads them.)

// sessionDir is where, inside the sandbox, an older snapshot's session.tar is unpacked for the interpreter.
const sessionDir = "/.ramify-session"

// Part is one object of a snapshot: its size and checksum (snapstore.Sum: "crc32c", or "sha256" in older
// manifests).
type Part struct {
	Size int64 `json:"size"`
	snapstore.Sum
}

// Manifest describes a snapshot.
type Manifest struct {
	Version   int             `json:"version"`
	Sandbox   string          `json:"sandbox"`
	CreatedAt time.Time       `json:"created_at"`
	Spec      json.RawMessage `json:"spec"`
	Parts     map[string]Part `json:"parts"`
	NotSaved  []agent.Skipped `json:"not_saved"`
	// Preload lists the packages loading session.bin will import (numpy, when its arrays are in it): a resume
	// may be given an interpreter that imported them ahead (runtime.Spec.Preload).
	Preload []string           `json:"preload,omitempty"`
	Extra   map[string]float64 `json:"extra,omitempty"`
}

// snapshotBytes is the size of a snapshot's parts.
func snapshotBytes(m Manifest) int64 {
	var n int64
	for _, p := range m.Parts {
		n += p.Size
	}
	return n
}

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

// savedSession is what saveSession stored and learnt.
type savedSession struct {
	part     Part
	notSaved []agent.Skipped // what could not be saved
	preload  []string        // the packages loading it will import (Manifest.Preload)
}

// saveSession has the interpreter of sandbox h (of spec) write its session as a session stream into a pipe
// whose other end goes straight into the snapshot store under key. The interpreter saves from a copy of itself,
// which the runtime, where it can (runtime.SaveCopier), gives a memory budget of its own: only that copy can run
// out of memory, and the sandbox runs on as it was.
func (s *Service) saveSession(ctx context.Context, c *agent.Client, h runtime.Handle, spec CreateRequest, key string) (savedSession, error) {
	pr, pw, err := newPipe()
	if err != nil {
		return savedSession{}, err
	}
	budget := s.saveBudget(h, spec)
	defer budget.close()
	// The interpreter must keep the session coming: code in the sandbox can keep it from answering at all (a
	// thread that holds the GIL in C code, a regular expression that backtracks for hours), which left the
	// sandbox pausing for ever. A wait of Config.InterpreterStall for its next bytes fails the pause; the sandbox
	// runs on. So does a session that trickles (a byte now and then, from an object's __reduce__ in the save
	// copy, which holds a memory budget of its own as long as the save lasts): once the save has run that long,
	// it must have averaged saveMinRate.
	idle := cmp.Or(s.cfg.InterpreterStall, runtime.DefaultInterpreterStall)
	ctx, stalled := context.WithCancelCause(ctx)
	defer stalled(nil)
	capBytes := sessionCap(spec.MemMiB)
	tooLong := errdefs.New(errdefs.ErrTooLarge, fmt.Sprintf("the session's stream passed %d MiB, four times mem_mib "+
		"(code in the sandbox writes it without end, an object's __reduce__ say); nothing was stored, and the sandbox "+
		"keeps running", capBytes>>20))
	src := &stallGuard{r: progressOf(ctx).reader(pr), idle: idle, minRate: saveMinRate, max: capBytes, tooLong: tooLong, stalled: func(slow bool) {
		if slow {
			stalled(fmt.Errorf("%w: under %d KiB/s after %v (code in the sandbox holds it back as it is saved?); "+
				"the sandbox keeps running", errSessionSlow, saveMinRate>>10, idle))
			return
		}
		stalled(fmt.Errorf("%w for %v: code in the sandbox keeps it from answering (a thread holding the GIL in "+
			"C code?); the sandbox keeps running, with a fresh interpreter if that one does not answer", errSessionStalled, idle))
	}}
	type put struct {
		obj snapstore.Object
		err error
		own bool // the store failed on its own, not because its end of the pipe was closed (cut)
	}
	// The store reads until the interpreter's end of the pipe closes. When the interpreter's save failed, or the
	// pause is stopped, that may never come (its end left open): the store's end is closed instead (cut), which
	// ends its read at once.
	var cut atomic.Bool
	unblock := func() {
		cut.Store(true)
		pr.Close()
	}
	done := make(chan put, 1)
	go func() {
		obj, err := s.cfg.Snapshots.Put(ctx, key, src)
		own := err != nil && !cut.Load()
		pr.Close() // a failed store stops the interpreter's writes (EPIPE)
		done <- put{obj, err, own}
	}()
	stop := context.AfterFunc(ctx, unblock)
	defer stop()
	skipped, preload, err := c.SnapshotSession(ctx, pw, budget.moved, budget.adopt)
	budget.moved = nil // taken
	// Whatever the copy left running goes now: a process it started holding the stream open would keep the
	// store's read waiting for the end of it.
	oom, kept := budget.end()
	if kept > runtime.SaveKeptSlack {
		err = &saveKeptError{kept: kept}
	}
	if err != nil {
		unblock()
	}
	p := <-done
	var keptErr *saveKeptError
	if errors.As(err, &keptErr) { // before any other failure: the caller must restart the sandbox's processes
		return savedSession{}, err
	}
	if oom && err != nil {
		err = errdefs.New(errdefs.ErrTooLarge, fmt.Sprintf("saving the session needs more memory than the %d MiB "+
			"a save may use (twice mem_mib); the sandbox runs on as it was (%v)", runtime.SaveCopyMemory(spec.MemMiB)>>20, err))
	}
	if cause := context.Cause(ctx); errors.Is(cause, errSessionStalled) {
		// Every later call would wait behind the save for ever: the agent replaces the interpreter if it is still
		// silent (its state is lost; the next run_code says so).
		if replaced, err := c.ReplaceStuck(ctx, runtime.StuckGrace); err != nil || replaced {
			s.log.Warn("interpreter silent during a pause", "replaced", replaced, "err", err)
		}
		return savedSession{}, cause
	}
	if cause := context.Cause(ctx); errors.Is(cause, errSessionSlow) {
		return savedSession{}, cause
	}
	if p.own {
		// The store failed first (and the interpreter's writes with it): its error is the cause.
		return savedSession{}, fmt.Errorf("write session.bin: %w", p.err)
	}
	if err != nil {
		return savedSession{}, err
	}
	if p.err != nil {
		return savedSession{}, fmt.Errorf("write session.bin: %w", p.err)
	}
	return savedSession{part: Part{Size: p.obj.Size, Sum: p.obj.Sum}, notSaved: skipped, preload: preload}, nil
}

// saveBudget is how a save's copy of the interpreter gets a memory budget of its own (runtime.SaveCopier).
type saveBudget struct {
	log   *slog.Logger
	id    string
	moved *os.File // the pipe's read end, for the interpreter (nil: no budget; the copy saves in the sandbox)
	tell  *os.File // its write end: one byte once the copy is moved
	move  func(pid int) error
	ended func() (bool, int64) // nil once ended
}

// saveBudget prepares a budget for h's save copy, if the runtime gives one.
func (s *Service) saveBudget(h runtime.Handle, spec CreateRequest) *saveBudget {
	b := &saveBudget{log: s.log, id: h.ID}
	sc, ok := s.cfg.Runtime.(runtime.SaveCopier)
	if !ok {
		return b
	}
	move, end, err := sc.SaveBudget(h, runtime.Spec{VCPU: spec.VCPU, MemMiB: spec.MemMiB, MaxProcs: spec.MaxProcs})
	if err != nil {
		s.log.Warn("save copy stays in its sandbox", "sandbox", h.ID, "err", err)
		return b
	}
	r, w, err := os.Pipe()
	if err != nil {
		end()
		s.log.Warn("save copy stays in its sandbox", "sandbox", h.ID, "err", err)
		return b
	}
	b.moved, b.tell, b.move, b.ended = r, w, move, end
	return b
}

// adopt moves the copy (pid in the sandbox's family) into its budget and tells it; if that fails, the copy is
// told to save where it is.
func (b *saveBudget) adopt(pid int) {
	if b.tell == nil {
		return
	}
	start := time.Now()
	if err := b.move(pid); err != nil {
		b.log.Warn("save copy stays in its sandbox", "sandbox", b.id, "err", err)
	} else {
		b.log.Debug("pause phase", "sandbox", b.id, "phase", "save copy moved", "ms", ms(time.Since(start)))
		b.tell.Write([]byte{1}) //nolint:errcheck // a copy gone already fails the save on its own
	}
	b.tell.Close()
	b.tell = nil
}

// end removes the budget once the save is over; it reports whether the kernel killed the copy there for want
// of memory, and the memory charged there that outlived the copy (runtime.SaveCopier).
func (b *saveBudget) end() (oom bool, kept int64) {
	if b.ended == nil {
		return false, 0
	}
	start := time.Now()
	oom, kept = b.ended()
	b.ended = nil
	b.log.Debug("pause phase", "sandbox", b.id, "phase", "save copy's cgroup removed", "ms", ms(time.Since(start)), "kept", kept)
	return oom, kept
}

// saveKeptError fails a save whose copy left memory charged to its budget that the sandbox's processes hold (a
// memfd, a tmpfs file or a System V segment written by the session's own code as it was saved): the sandbox
// would keep it beyond its mem_mib. It goes only with the sandbox's processes and namespaces: the caller
// restarts them (keepsSaveMemory).
type saveKeptError struct{ kept int64 }

func (e *saveKeptError) Error() string {
	return fmt.Sprintf("code of the session, run as it was saved, left %.1f MiB written into memory the sandbox keeps "+
		"(shared memory, a memfd, a file in /dev/shm) outside its mem_mib; its processes were restarted to give it "+
		"back: the interpreter's state is lost, its files are kept", float64(e.kept)/(1<<20))
}

func (b *saveBudget) close() {
	b.end()
	for _, f := range []*os.File{b.moved, b.tell} {
		if f != nil {
			f.Close()
		}
	}
}

// errSessionStalled fails a pause whose interpreter stopped sending its session (saveSession, Config.InterpreterStall).
var errSessionStalled = errors.New("the interpreter sent nothing of its session")

// errSessionSlow fails a pause whose interpreter sends its session slower than saveMinRate on average.
var errSessionSlow = errors.New("the interpreter sent its session too slowly")

// saveMinRate is what a session's save must average once it has run for Config.InterpreterStall: far below any
// store's or pickler's pace (tens to hundreds of MiB/s), far above a trickle.
const saveMinRate = 1 << 20

// sessionCapFactor bounds a pause's session stream at this many times the sandbox's mem_mib. A session's stream
// is about the size of what the interpreter holds (arrays as their bytes; Python objects take less than in
// memory), and its save copy may use twice mem_mib: four times leaves room. Without a bound, code in the sandbox
// filled the snapshot store's disk through its own pause: an object whose __reduce__ gives an endless iterator
// of items (the pickler writes them with no memory growing), or that writes to the stream's pipe itself.
const sessionCapFactor = 4

// sessionCap is the longest session stream a pause of a sandbox with memMiB of memory stores.
func sessionCap(memMiB int) int64 { return sessionCapFactor * int64(memMiB) << 20 }

// stallGuard reads r, calling stalled(false) once a read has waited idle for data (time the reader spends
// between reads, in the store, does not count), and stalled(true) once, after idle, the bytes read average less
// than minRate a second (0: no minimum). One timer serves every read. A stream longer than max bytes (0: no
// bound) ends in tooLong.
type stallGuard struct {
	r       io.Reader
	idle    time.Duration
	minRate int64
	stalled func(slow bool)
	max     int64
	tooLong error
	t       *time.Timer
	began   time.Time
	total   int64
	slow    bool // stalled(true) was called
}

func (g *stallGuard) Read(p []byte) (int, error) {
	if g.max > 0 {
		if g.total > g.max {
			return 0, g.tooLong
		}
		if left := g.max - g.total + 1; int64(len(p)) > left { // one byte past max tells a longer stream
			p = p[:left]
		}
	}
	if g.t == nil {
		g.began = time.Now()
		g.t = time.AfterFunc(g.idle, func() { g.stalled(false) })
	} else {
		g.t.Reset(g.idle)
	}
	n, err := g.r.Read(p)
	g.t.Stop()
	g.total += int64(n)
	if g.max > 0 && g.total > g.max {
		return 0, g.tooLong
	}
	if el := time.Since(g.began); g.minRate > 0 && !g.slow && el > g.idle && float64(g.total) < el.Seconds()*float64(g.minRate) {
		g.slow = true
		g.stalled(true)
	}
	return n, err
}

// fileOpener is a snapshot store that can hand out an object's file (the local store).
type fileOpener interface {
	OpenFile(ctx context.Context, key string) (*os.File, error)
}

// loadSession has the interpreter load the snapshot's session.bin, checked against the manifest's size and
// checksum; a mismatch fails the load (the caller then discards the sandbox). From a local store the interpreter
// gets the file itself (read-only), reads it with direct I/O and checksums it as it reads, in the manifest's
// algorithm (agent.StreamRead): one
// read of the file, not two side by side; when it cannot say what it read (it failed part way, or is older),
// the server reads and hashes the file itself, so that a corrupt part is told from another failure. From any
// other store the part streams through a pipe, hashed on the way.
func (s *Service) loadSession(ctx context.Context, c *agent.Client, prefix string, m Manifest) ([]agent.Skipped, error) {
	want := m.Parts["session.bin"]
	key := prefix + "session.bin"
	if fo, ok := s.cfg.Snapshots.(fileOpener); ok {
		f, err := fo.OpenFile(ctx, key)
		if err != nil {
			return nil, fmt.Errorf("snapshot part session.bin is missing: %w", err)
		}
		skipped, read, err := c.RestoreSession(ctx, f, want.Algorithm())
		if err == nil {
			progressOf(ctx).add(want.Size) // read by the interpreter itself
		}
		if err == nil && read != nil {
			return skipped, checkSum("session.bin", read.Bytes, snapstore.Sum{CRC32C: read.CRC32C, SHA256: read.SHA256}, want)
		}
		if cerr := s.checkStored(ctx, prefix, "session.bin", want); cerr != nil {
			return skipped, cerr // the cause, when the interpreter choked on a corrupt stream
		}
		return skipped, err
	}
	rc, err := s.cfg.Snapshots.Get(ctx, key)
	if err != nil {
		return nil, fmt.Errorf("snapshot part session.bin is missing: %w", err)
	}
	give, pw, err := newPipe()
	if err != nil {
		rc.Close()
		return nil, fmt.Errorf("snapshot part session.bin: %w", err)
	}
	done := make(chan error, 1)
	go func() {
		defer rc.Close()
		h := want.NewHash()
		n, werr := copyHashed(pw, progressOf(ctx).reader(rc), h)
		pw.Close()
		if werr != nil && !errors.Is(werr, errReaderGone) {
			done <- cutShort("session.bin", n, want, werr)
			return
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
	skipped, _, err := c.RestoreSession(ctx, give, want.Algorithm())
	if cerr := <-done; cerr != nil {
		return skipped, cerr // the cause, when the interpreter choked on a corrupt stream
	}
	return skipped, err
}

// checkStored reads part name of the snapshot at prefix and checks its size and checksum against want.
func (s *Service) checkStored(ctx context.Context, prefix, name string, want Part) error {
	rc, err := s.cfg.Snapshots.Get(ctx, prefix+name)
	if err != nil {
		return fmt.Errorf("snapshot part %s is missing: %w", name, err)
	}
	defer rc.Close()
	h := want.NewHash()
	n, err := copyHashed(io.Discard, rc, h)
	if err != nil {
		return fmt.Errorf("snapshot part %s: %w", name, err)
	}
	return checkPart(name, n, h, want)
}

var errReaderGone = errors.New("the interpreter stopped reading")

// copyHashed copies r to w and through h, in 1 MiB pieces; h hashes in a goroutine of its own, a few pieces
// behind the copy (the SHA-256 of an older snapshot's 1 GiB is ~0.75 s of a core: the interpreter reading w does
// not wait for it).
// When w fails (the interpreter stopped reading) it goes on reading r into h, so that the caller can still tell
// a corrupt part from a refused one.
func copyHashed(w io.Writer, r io.Reader, h io.Writer) (int64, error) {
	const pieces = 4
	free, full := make(chan []byte, pieces), make(chan []byte, pieces)
	for range pieces {
		free <- make([]byte, 1<<20)
	}
	hashed := make(chan struct{})
	go func() {
		defer close(hashed)
		for b := range full {
			h.Write(b)
			free <- b[:cap(b)]
		}
	}()
	var n int64
	var werr, rerr error
	for {
		b := <-free
		k, err := r.Read(b)
		if k > 0 {
			n += int64(k)
			if werr == nil {
				if _, err := w.Write(b[:k]); err != nil {
					werr = errReaderGone
				}
			}
			full <- b[:k]
		} else {
			free <- b
		}
		if err != nil {
			if err != io.EOF {
				rerr = err
			}
			break
		}
	}
	close(full)
	<-hashed
	if rerr != nil {
		return n, rerr
	}
	return n, werr
}

// putTar streams a tar of dir, of at most maxData bytes of file data (0: no bound), into the snapshot store.
func (s *Service) putTar(ctx context.Context, key, dir string, skip func(string) bool, maxData int64) (Part, error) {
	if _, err := os.Stat(dir); err != nil {
		return Part{}, err
	}
	pr, pw := io.Pipe()
	go func() {
		_, err := layertar.Write(pw, dir, skip, maxData)
		pw.CloseWithError(err)
	}()
	obj, err := s.cfg.Snapshots.Put(ctx, key, progressOf(ctx).reader(pr))
	pr.CloseWithError(err)
	if err != nil {
		return Part{}, err
	}
	return Part{Size: obj.Size, Sum: obj.Sum}, nil
}

func (s *Service) readManifest(ctx context.Context, prefix string) (Manifest, error) {
	var m Manifest
	rc, err := s.cfg.Snapshots.Get(ctx, prefix+"manifest.json")
	if errors.Is(err, errdefs.ErrNotFound) {
		return m, fmt.Errorf("snapshot %s has no manifest: %w", prefix, err)
	}
	if err != nil {
		return m, fmt.Errorf("snapshot %s: read its manifest (the snapshot is kept: try again once the store answers): %w", prefix, err)
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

// extractPart streams a part into dir, checking its size and checksum against the manifest.
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
	h := want.NewHash()
	cr := &countingReader{r: io.TeeReader(progressOf(ctx).reader(rc), h)}
	_, xerr := layertar.Extract(cr, dir)
	// Read the rest (tar padding after the end marker counts too; after a failed extract, it tells a corrupt
	// part from a bad one).
	io.Copy(io.Discard, cr) //nolint:errcheck // cr.err has it
	if cr.err != nil {
		return cutShort(name, cr.n, want, cr.err)
	}
	if err := checkPart(name, cr.n, h, want); err != nil {
		return err
	}
	if xerr != nil {
		return fmt.Errorf("snapshot part %s: %w", name, xerr)
	}
	return nil
}

// checkPart compares n bytes read with hash h (want.NewHash's) against what the manifest says of part name.
func checkPart(name string, n int64, h hash.Hash, want Part) error {
	return checkSum(name, n, want.Of(h), want)
}

// checkSum is checkPart for a part read as n bytes with checksum sum.
func checkSum(name string, n int64, sum snapstore.Sum, want Part) error {
	if n != want.Size || sum != want.Sum {
		return errdefs.New(errdefs.ErrInvalid, fmt.Sprintf("snapshot part %s is corrupt: %d bytes with %v, manifest says %d bytes with %v", name, n, sum, want.Size, want.Sum))
	}
	return nil
}

// countingReader counts what it reads, and keeps the first read error (not the end of the stream).
type countingReader struct {
	r   io.Reader
	n   int64
	err error
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	if err != nil && err != io.EOF && c.err == nil {
		c.err = err
	}
	return n, err
}

// cutShort is the error of a part whose reading failed after n bytes: the store, not the snapshot, failed (a
// transfer cut off is not a corrupt part, and the snapshot must not look lost).
func cutShort(name string, n int64, want Part, err error) error {
	return fmt.Errorf("snapshot part %s could not be read (after %d of its %d bytes; the snapshot is kept: resume again once the store answers): %w",
		name, n, want.Size, err)
}
