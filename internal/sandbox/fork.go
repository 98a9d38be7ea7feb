package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path"
	"sort"
	"sync"
	"time"

	"github.com/ramify-dev/ramify/internal/crashpoint"
	"github.com/ramify-dev/ramify/internal/errdefs"
	"github.com/ramify-dev/ramify/internal/events"
	"github.com/ramify-dev/ramify/internal/fsdiff"
	"github.com/ramify-dev/ramify/internal/network"
	"github.com/ramify-dev/ramify/internal/runtime"
	"github.com/ramify-dev/ramify/internal/store"
)

// MaxForkChildren bounds one fork.
const MaxForkChildren = 32

// ForkResult is what a fork returns.
type ForkResult struct {
	Children []string `json:"children"`
	// ParentPauseMs is how long the parent was frozen while its state was captured.
	ParentPauseMs float64 `json:"parent_pause_ms"`
	// Note states what is and is not cloned.
	Note string `json:"note"`
	// MadeAhead is set when the children were made ahead of the call, while the parent was idle, and the parent
	// had not changed since (ahead.go); ParentPauseMs is then that fork's.
	MadeAhead bool `json:"made_ahead,omitempty"`
}

// ForkNote is the fork response's statement of what a child inherits.
const ForkNote = "each child runs a copy-on-write fork of the parent's Python interpreter and a copy-on-write clone of its file system; other processes of the parent are not cloned"

func (s *Service) forker() (runtime.Forker, error) {
	f, ok := s.cfg.Runtime.(runtime.Forker)
	if !ok {
		return nil, errdefs.New(errdefs.ErrConflict, "this runtime cannot fork sandboxes")
	}
	return f, nil
}

// Fork branches a running sandbox into n children that start from its current state. A paused sandbox is
// forked from a byte-identical copy of its snapshot instead (see forkPaused).
func (s *Service) Fork(ctx context.Context, id string, n int) (ForkResult, error) {
	return s.ForkWith(ctx, id, n, false)
}

// ForkWith is Fork; startPaused applies to the fork of a paused sandbox (children stay paused).
func (s *Service) ForkWith(ctx context.Context, id string, n int, startPaused bool) (ForkResult, error) {
	return s.ForkWithEgress(ctx, id, n, startPaused, nil)
}

// ForkWithEgress is ForkWith; a non-nil egress gives the children that egress list (see CreateRequest.Egress:
// *egress == nil is the default policy, an empty list no outbound traffic) instead of the parent's.
func (s *Service) ForkWithEgress(ctx context.Context, id string, n int, startPaused bool, egress *[]string) (ForkResult, error) {
	return s.ForkWithOptions(ctx, id, n, ForkOptions{StartPaused: startPaused, Egress: egress})
}

// ForkOptions are what a fork call may set for its children; nil fields keep the parent's.
type ForkOptions struct {
	StartPaused bool
	// Egress replaces the parent's egress list (see CreateRequest.Egress: *Egress == nil is the default policy).
	Egress *[]string
	// IngressEnabled replaces the parent's ingress_enabled.
	IngressEnabled *bool
	// SSHPubkeys are authorized on the children on top of the parent's keys (ssh.go).
	SSHPubkeys []string
}

// apply gives spec the options' overrides and reports whether there were any.
func (o ForkOptions) apply(spec *CreateRequest) bool {
	if o.Egress != nil {
		spec.Egress = *o.Egress
	}
	if o.IngressEnabled != nil {
		spec.IngressEnabled = *o.IngressEnabled
	}
	if len(o.SSHPubkeys) > 0 {
		spec.SSHPubkeys, _ = normalizeSSHKeys(spec.SSHPubkeys, o.SSHPubkeys) // validated by ForkWithOptions
	}
	return o.Egress != nil || o.IngressEnabled != nil || len(o.SSHPubkeys) > 0
}

// ForkWithOptions is Fork with the options of a fork call.
func (s *Service) ForkWithOptions(ctx context.Context, id string, n int, o ForkOptions) (_ ForkResult, err error) {
	startPaused, egress := o.StartPaused, o.Egress
	if n < 1 || n > MaxForkChildren {
		return ForkResult{}, invalid("n must be between 1 and %d", MaxForkChildren)
	}
	if egress != nil {
		if _, err := network.ParseEgress(*egress); err != nil {
			return ForkResult{}, err
		}
	}
	if _, err := normalizeSSHKeys(nil, o.SSHPubkeys); err != nil {
		return ForkResult{}, err
	}
	fk, err := s.forker()
	if err != nil {
		return ForkResult{}, err
	}
	// Exclusive: in-flight calls on the parent finish first, so its interpreter is idle when it forks.
	es, releaseParent, err := s.acquire(exclusive, OpFork, id)
	if err != nil {
		return ForkResult{}, err
	}
	var once sync.Once
	release := func() { once.Do(releaseParent) }
	defer release()
	e := es[0]
	// A fork can wait long on the parent's interpreter (code holding the GIL keeps it from answering, up to the
	// runtime's stall bound): a delete of the parent stops it, and it rolls back.
	ctx, done := s.stoppable(ctx, e)
	defer done()
	defer func() { err = callError(ctx, id, err) }() // whichever way it forks (at the call, ahead, paused)
	s.mu.Lock()
	if Status(e.rec.Status) == StatusPaused {
		s.mu.Unlock()
		if err := s.snapshots(); err != nil {
			return ForkResult{}, err
		}
		res, err := s.forkPaused(ctx, e, n, startPaused, o)
		release()
		if err == nil && !startPaused {
			s.resumeForked(ctx, res.Children)
		}
		return res, err
	}
	spec := e.spec
	overridden := o.apply(&spec)
	s.mu.Unlock()
	if !overridden {
		if out, ok, err := s.forkFromAhead(ctx, e, spec, n); ok {
			return out, err
		}
	}
	var undo undoStack
	fail := func(err error) (ForkResult, error) {
		return ForkResult{}, s.fail(ctx, &undo, fmt.Errorf("fork %s: %w", id, err))
	}
	start := time.Now()
	kids, res, err := s.forkChildren(ctx, fk, e, spec, n, StatusCreating, &undo)
	for _, k := range kids {
		defer k.op.Unlock() // calls on a child wait until it is made
	}
	if err != nil {
		return fail(err)
	}
	if err := s.startChildren(ctx, kids, time.Time{}); err != nil {
		return fail(err)
	}
	if !overridden {
		s.noteFork(e, n)
	}
	return s.forked(e, kids, res.PauseWindow, false, start), nil
}

// forked is the result of e's fork into kids, begun at start, whose records are saved (made at the call, or made
// ahead and frozen the parent for pause then), logged and published.
func (s *Service) forked(e *entry, kids []*entry, pause time.Duration, madeAhead bool, start time.Time) ForkResult {
	out := ForkResult{ParentPauseMs: float64(pause.Microseconds()) / 1000, Note: ForkNote, MadeAhead: madeAhead}
	for _, k := range kids {
		out.Children = append(out.Children, k.rec.ID)
	}
	s.log.Info("sandbox forked", "sandbox", e.rec.ID, "family", e.rec.FamilyID, "n", len(kids),
		"ms", time.Since(start).Milliseconds(), "pause_ms", out.ParentPauseMs, "made_ahead", madeAhead)
	s.emit(events.Event{Type: events.Forked, Sandbox: e.rec.ID, Family: e.rec.FamilyID, Status: string(StatusRunning),
		Children: out.Children, N: len(kids), Ms: msSince(start), PauseMs: out.ParentPauseMs})
	return out
}

// forkChildren reserves n children of the running sandbox e (held exclusively by the caller) with spec, and forks
// e's runtime sandbox into them. status is StatusCreating for a fork call's children, admitted against capacity
// and returned locked (exclusive: calls on them wait until the caller unlocks them), or StatusWarm for children
// made ahead (ahead.go): pooled, invisible to the API. Each child has its handle; everything done is on undo,
// even when it fails.
func (s *Service) forkChildren(ctx context.Context, fk runtime.Forker, e *entry, spec CreateRequest, n int, status Status, undo *undoStack) ([]*entry, runtime.ForkResult, error) {
	specs := make([]runtime.Spec, n)
	kids := make([]*entry, 0, n)
	now := time.Now().UTC()
	specJSON, _ := json.Marshal(spec)
	s.mu.Lock()
	parent, id := e.handle, e.rec.ID
	if status == StatusCreating {
		if err := s.admitLocked(spec, n); err != nil {
			s.mu.Unlock()
			return nil, runtime.ForkResult{}, err
		}
	}
	for i := range specs {
		cid := NewID()
		ip, err := s.allocateIP()
		if err != nil {
			s.mu.Unlock()
			return kids, runtime.ForkResult{}, err
		}
		specs[i] = runtime.Spec{ID: cid, Hostname: hostnameOf(cid), IP: ip, VCPU: spec.VCPU, MemMiB: spec.MemMiB,
			MaxProcs: spec.MaxProcs, DiskMiB: spec.DiskMiB, Env: spec.Env, Cwd: spec.Cwd, Image: spec.Image}
		specs[i].Egress = spec.Egress
		k := &entry{spec: spec, pooled: status == StatusWarm, rec: store.Record{ID: cid, Status: string(status),
			FamilyID: e.rec.FamilyID, ParentID: id, IP: ip.String(), Hostname: specs[i].Hostname, CreatedAt: now,
			Spec: specJSON}}
		if status == StatusCreating {
			k.op.Lock() // new: nobody else holds it
		}
		kids = append(kids, k)
		s.items[cid] = k // reserves the address
		undo.push("reserve "+cid, func(context.Context) error {
			s.mu.Lock()
			defer s.mu.Unlock()
			s.retire(k)
			return nil
		})
	}
	s.mu.Unlock()

	res, err := fk.Fork(ctx, parent, specs)
	if err != nil {
		return kids, res, err
	}
	for _, h := range res.Children {
		undo.push("child "+h.ID, func(ctx context.Context) error { return s.cfg.Runtime.Destroy(ctx, h) })
	}
	s.mu.Lock()
	for i, k := range kids {
		h := res.Children[i]
		hj, _ := json.Marshal(h)
		k.handle = h
		k.rec.Handle = hj
	}
	s.mu.Unlock()
	return kids, res, nil
}

// startChildren makes forked children (forkChildren) running sandboxes: their records saved as running in one
// store transaction (every child's record or none: the fork's commit point), then their state and timeouts.
// created, when set, replaces their creation time.
func (s *Service) startChildren(ctx context.Context, kids []*entry, created time.Time) error {
	recs := make([]store.Record, len(kids))
	s.mu.Lock()
	for i, k := range kids {
		recs[i] = k.rec
		recs[i].Status = string(StatusRunning) // applied in memory once saved
		if !created.IsZero() {
			recs[i].CreatedAt = created
		}
		if err := transition(k.rec.ID, Status(k.rec.Status), StatusRunning); err != nil {
			s.mu.Unlock()
			return err
		}
	}
	s.mu.Unlock()
	// A call cancelled by now is undone; the write itself is not cancellable: cut short by its context as it
	// commits, it would report an error for records it wrote, and the caller would destroy the children they name.
	if err := ctx.Err(); err != nil {
		return err
	}
	if err := s.cfg.Store.PutMany(context.WithoutCancel(ctx), recs, nil); err != nil {
		return err
	}
	s.mu.Lock()
	for i, k := range kids {
		k.rec.CreatedAt = recs[i].CreatedAt
		k.pooled = false
		s.setStatus(k, StatusRunning) //nolint:errcheck // checked above; nobody else holds the child
	}
	s.mu.Unlock()
	for _, k := range kids {
		s.armTimer(k)
	}
	return nil
}

// MergeInto commits winner's state into parent: parent's id drives the winner's interpreter, files, processes
// and address from now on, the parent's old state is destroyed and winner's id is retired.
func (s *Service) MergeInto(ctx context.Context, parentID, winnerID string) error {
	if parentID == winnerID {
		return invalid("cannot merge a sandbox into itself: parent and winner are the same id")
	}
	fk, err := s.forker()
	if err != nil {
		return err
	}
	es, release, err := s.acquire(exclusive, OpMerge, parentID, winnerID)
	if err != nil {
		return err
	}
	defer release()
	p, w := es[0], es[1]
	s.mu.Lock()
	if p.spec.Image != w.spec.Image {
		pi, wi := s.info(p).Image, s.info(w).Image
		s.mu.Unlock()
		return errdefs.New(errdefs.ErrConflict, fmt.Sprintf("cannot merge %s into %s: they run on different images (%s and %s); merge_into needs one image",
			winnerID, parentID, wi, pi))
	}
	ph, wh := p.handle, w.handle
	oldP, oldW := p.rec, w.rec
	nh := fk.Rekeyed(ph, wh)
	rec, spec := mergedRecord(p, w, nh)
	s.mu.Unlock()

	start := time.Now()
	// The records first (the commit point): a server killed from here on restarts with the merge done, the
	// parent's id recovering the winner's processes, and reclaims the parent's old ones (see reclaim.go).
	gone := store.Retired{ID: winnerID, MergedInto: parentID, At: time.Now()}
	if err := s.cfg.Store.Merge(ctx, rec, winnerID, gone.At); err != nil {
		return fmt.Errorf("merge %s into %s: save records: %w", winnerID, parentID, err)
	}
	crashpoint.Hit(crashpoint.MergeAfterCommit)
	got, err := fk.Swap(ctx, ph, wh)
	if err != nil {
		if rerr := s.cfg.Store.UndoMerge(context.WithoutCancel(ctx), oldP, oldW); rerr != nil {
			s.log.Error("merge failed and its records could not be restored", "sandbox", parentID, "winner", winnerID, "err", rerr)
		}
		return fmt.Errorf("merge %s into %s: %w", winnerID, parentID, err)
	}
	crashpoint.Hit(crashpoint.MergeAfterSwap)
	if got != nh {
		s.log.Warn("merge: the runtime's handle differs from the one recorded", "sandbox", parentID)
		rec.Handle, _ = json.Marshal(got)
		nh = got
		s.cfg.Store.Put(context.WithoutCancel(ctx), rec) //nolint:errcheck // the in-memory state is right
	}
	s.mu.Lock()
	// Field by field: rec.ID is read without s.mu (acquire), so it is never written.
	p.handle, p.spec = nh, spec
	p.rec.Handle, p.rec.Spec, p.rec.IP, p.rec.Hostname, p.rec.FamilyID = rec.Handle, rec.Spec, rec.IP, rec.Hostname, rec.FamilyID
	s.retire(w)
	s.retired[winnerID] = gone
	s.mu.Unlock()
	s.log.Info("sandbox merged", "sandbox", parentID, "winner", winnerID, "ms", time.Since(start).Milliseconds())
	s.emit(events.Event{Type: events.Merged, Sandbox: parentID, Family: rec.FamilyID, Status: string(StatusRunning),
		Winner: winnerID, Ms: msSince(start)})
	return nil
}

// mergedRecord is parent p's record and spec once winner w is merged into it with handle nh: the winner's
// address, family, limits, env, cwd and network under the parent's id. The caller holds s.mu.
func mergedRecord(p, w *entry, nh runtime.Handle) (store.Record, CreateRequest) {
	rec, spec := p.rec, p.spec
	rec.Handle, _ = json.Marshal(nh)
	rec.IP, rec.Hostname, rec.FamilyID = w.rec.IP, w.rec.Hostname, w.rec.FamilyID
	spec.Env, spec.Cwd = w.spec.Env, w.spec.Cwd
	spec.VCPU, spec.MemMiB, spec.MaxProcs = w.spec.VCPU, w.spec.MemMiB, w.spec.MaxProcs
	spec.Egress = w.spec.Egress              // the winner's network (address and policy) is what now runs under the parent's id
	rec.Spec = specJSON(spec, p.timeoutFrom) // a keepalive's deadline stays the parent's
	return rec, spec
}

// DefaultDiffPaths are compared when a diff names none.
var DefaultDiffPaths = []string{"/root", "/tmp"}

// Diff compares the file systems of a and b under paths: what b has that a has not (added), what a has that b
// has not (removed), and what both have with different content (modified). It stops when ctx ends (the client
// went away) or either sandbox is deleted (a conflict).
func (s *Service) Diff(ctx context.Context, aID, bID string, paths []string) (_ fsdiff.Result, err error) {
	if len(paths) == 0 {
		paths = DefaultDiffPaths
	}
	if len(paths) > 64 {
		return fsdiff.Result{}, invalid("at most 64 paths")
	}
	clean := make([]string, 0, len(paths))
	for _, p := range paths {
		if !path.IsAbs(p) || len(p) > 4096 {
			return fsdiff.Result{}, invalid("paths must be absolute: %q", p)
		}
		clean = append(clean, path.Clean(p))
	}
	sort.Strings(clean)
	fk, err := s.forker()
	if err != nil {
		return fsdiff.Result{}, err
	}
	es, release, err := s.acquire(shared, OpDiff, aID, bID)
	if err != nil {
		return fsdiff.Result{}, err
	}
	defer release()
	a, b := es[0], es[1]
	// A diff holds both sandboxes for as long as it reads their layers (up to fsdiff.MaxContentBytes of content):
	// a delete of either stops it rather than waits for it.
	actx, doneA := s.stoppedByDelete(ctx, a)
	defer doneA()
	ctx, doneB := s.stoppedByDelete(actx, b)
	defer doneB()
	defer func() {
		if errors.Is(context.Cause(actx), errDeleted) {
			err = callError(actx, aID, err) // ctx too says deleted, as actx's child: a's delete came first
		} else {
			err = callError(ctx, bID, err)
		}
	}()
	s.mu.Lock()
	ha, hb := a.handle, b.handle
	s.mu.Unlock()
	start := time.Now()
	la, err := layersOf(fk, ha)
	if err != nil {
		return fsdiff.Result{}, fmt.Errorf("diff %s %s: %w", aID, bID, err)
	}
	lb, err := layersOf(fk, hb)
	if err != nil {
		return fsdiff.Result{}, fmt.Errorf("diff %s %s: %w", aID, bID, err)
	}
	res, err := fsdiff.Compare(ctx, la, lb, clean)
	if err != nil {
		return res, fmt.Errorf("diff %s %s: %w", aID, bID, err)
	}
	s.emit(events.Event{Type: events.Diffed, Sandbox: aID, Other: bID, Family: a.rec.FamilyID, Ms: msSince(start)})
	return res, nil
}

// layersOf is a running sandbox's file system as layers on the host: its writable layer over its image's.
func layersOf(fk runtime.Forker, h runtime.Handle) (fsdiff.Layers, error) {
	lowers, err := fk.LowerDirs(h)
	if err != nil {
		return fsdiff.Layers{}, err
	}
	n := len(lowers)
	return fsdiff.Layers{Upper: fk.UpperDir(h), Lower: lowers[n-1], Over: lowers[:n-1]}, nil
}
