package sandbox

import (
	"context"
	"io"
	"sync/atomic"
	"time"
)

// Progress is how far a pause or a resume in flight has got: GET of a sandbox that is pausing or resuming
// reports it, and the CLI shows it as it waits.
type Progress struct {
	// Phase is the part being moved: a pause writes the interpreter's "session", then the sandbox's "files",
	// then "commits" (manifest, freeing the sandbox); a resume restores the "files", then loads the "session".
	Phase string `json:"phase"`
	// Bytes is what the snapshot store has been given (a pause) or has handed out (a resume) so far, all parts
	// together. A resume from a local store counts the session only once it is loaded (the interpreter reads
	// the stored file itself).
	Bytes int64 `json:"bytes"`
	// TotalBytes is the snapshot's size for a resume (from its manifest; 0 until it is read); a pause does not
	// know it ahead (0).
	TotalBytes int64   `json:"total_bytes,omitempty"`
	ElapsedMs  float64 `json:"elapsed_ms"`
}

// progress is a pause's or resume's Progress as it changes: the work updates it from its own goroutines, GET
// reads it (lock-free).
type progress struct {
	start time.Time
	phase atomic.Pointer[string]
	bytes atomic.Int64
	total atomic.Int64
}

func newProgress(phase string) *progress {
	p := &progress{start: time.Now()}
	p.setPhase(phase)
	return p
}

// setPhase, add and setTotal do nothing on a nil progress (work that reports none: a template's capture).
func (p *progress) setPhase(phase string) {
	if p != nil {
		p.phase.Store(&phase)
	}
}

func (p *progress) add(n int64) {
	if p != nil {
		p.bytes.Add(n)
	}
}

func (p *progress) setTotal(n int64) {
	if p != nil {
		p.total.Store(n)
	}
}

// reader counts what is read through r.
func (p *progress) reader(r io.Reader) io.Reader {
	if p == nil {
		return r
	}
	return &progressReader{r: r, p: p}
}

func (p *progress) view() *Progress {
	if p == nil {
		return nil
	}
	return &Progress{Phase: *p.phase.Load(), Bytes: p.bytes.Load(), TotalBytes: p.total.Load(), ElapsedMs: ms(time.Since(p.start))}
}

type progressReader struct {
	r io.Reader
	p *progress
}

func (r *progressReader) Read(b []byte) (int, error) {
	n, err := r.r.Read(b)
	r.p.add(int64(n))
	return n, err
}

// endProgress drops e's progress p once its pause or resume is over.
func (s *Service) endProgress(e *entry, p *progress) {
	s.mu.Lock()
	if e.prog == p {
		e.prog = nil
	}
	s.mu.Unlock()
}

type progressKey struct{}

// withProgress carries p to the parts of a pause or resume that move bytes (saveSession, putTar, extractPart,
// loadSession).
func withProgress(ctx context.Context, p *progress) context.Context {
	return context.WithValue(ctx, progressKey{}, p)
}

// progressOf is ctx's progress, nil when none.
func progressOf(ctx context.Context) *progress {
	p, _ := ctx.Value(progressKey{}).(*progress)
	return p
}
