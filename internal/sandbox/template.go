package sandbox

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/ramify-dev/ramify/internal/agent"
	"github.com/ramify-dev/ramify/internal/errdefs"
	"github.com/ramify-dev/ramify/internal/image"
	"github.com/ramify-dev/ramify/internal/runtime"
	"github.com/ramify-dev/ramify/internal/store"
)

// Templates. A template is a running sandbox's snapshot, written as a pause writes one (writeSnapshot: the
// interpreter's session, then the layer while frozen, then the manifest) under "templates/<name>/<time>/" in
// the snapshot store, except that the sandbox is thawed afterwards and keeps running as it was. Its record
// (store.Template) names the snapshot; both survive restarts. A create from a template is a restore (restore,
// as a resume does it) into a new id, address and spec; it only reads the snapshot, so any number of sandboxes
// can start from one template at once. A per-name lock keeps a delete from removing a snapshot a create is
// reading, and two captures of one name apart.

// TemplateInfo is the API view of a template.
type TemplateInfo struct {
	Name      string    `json:"name"`
	From      string    `json:"from"`
	CreatedAt time.Time `json:"created_at"`
	// Size is the snapshot's size in bytes (session and files).
	Size int64 `json:"size"`
	// NotSaved lists the interpreter's variables the capture could not save (new sandboxes lack them).
	NotSaved []agent.Skipped `json:"not_saved"`
	// CaptureMs is how long the capture held the sandbox.
	CaptureMs float64 `json:"capture_ms"`
	// Spec is what sandboxes created from the template get, unless the create request says otherwise.
	Spec CreateRequest `json:"spec"`
}

// templateNote is what a template's record keeps besides its snapshot (store.Template.Info).
type templateNote struct {
	Size      int64           `json:"size"`
	NotSaved  []agent.Skipped `json:"not_saved"`
	CaptureMs float64         `json:"capture_ms"`
}

// ValidTemplateName checks a template's name: 1 to 63 characters, lower-case letters, digits, '-', '_' and '.',
// starting with a letter or a digit.
func ValidTemplateName(name string) error {
	ok := len(name) >= 1 && len(name) <= 63
	for i := 0; ok && i < len(name); i++ {
		c := name[i]
		alnum := c >= 'a' && c <= 'z' || c >= '0' && c <= '9'
		ok = alnum || i > 0 && (c == '-' || c == '_' || c == '.')
	}
	if !ok {
		return invalid("invalid template name %q: 1 to 63 characters of a-z, 0-9, '-', '_' and '.', starting with a letter or a digit", name)
	}
	return nil
}

// templateLocks holds one lock per template name: creates from a template hold it shared, a capture or a delete
// exclusively.
type templateLocks struct {
	mu    sync.Mutex
	locks map[string]*sync.RWMutex
}

func (l *templateLocks) of(name string) *sync.RWMutex {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.locks == nil {
		l.locks = map[string]*sync.RWMutex{}
	}
	if l.locks[name] == nil {
		l.locks[name] = &sync.RWMutex{}
	}
	return l.locks[name]
}

// SaveTemplate captures running sandbox from under name. It holds the sandbox exclusively while it writes the
// snapshot (calls on it wait, as during a pause), and leaves it running as it was. 409 when the name is taken.
func (s *Service) SaveTemplate(ctx context.Context, name, from string) (TemplateInfo, error) {
	if err := ValidTemplateName(name); err != nil {
		return TemplateInfo{}, err
	}
	if err := s.snapshots(); err != nil {
		return TemplateInfo{}, err
	}
	fk, ok := s.cfg.Runtime.(runtime.Forker)
	if !ok {
		return TemplateInfo{}, errdefs.New(errdefs.ErrConflict, "this runtime cannot capture sandboxes")
	}
	l := s.tmpl.of(name)
	l.Lock()
	defer l.Unlock()
	if _, err := s.cfg.Store.GetTemplate(ctx, name); err == nil {
		return TemplateInfo{}, errdefs.New(errdefs.ErrConflict, fmt.Sprintf("template %q already exists", name))
	} else if !errors.Is(err, errdefs.ErrNotFound) {
		return TemplateInfo{}, err
	}
	es, release, err := s.acquire(exclusive, OpTemplate, from)
	if err != nil {
		return TemplateInfo{}, err
	}
	defer release()
	cctx, done := s.stoppable(ctx, es[0]) // a delete of the sandbox stops the capture
	t, err := s.capture(cctx, fk, es[0], name)
	done()
	if err != nil {
		return TemplateInfo{}, callError(cctx, from, fmt.Errorf("save template %s of %s: %w", name, from, err))
	}
	s.kickTemplatePool(name)
	s.log.Info("template saved", "template", name, "sandbox", from, "bytes", t.Size, "ms", t.CaptureMs)
	return t, nil
}

// capture writes e's snapshot as template name and records it; the caller holds e exclusively. The sandbox is
// thawed whatever happens; on failure nothing of the template is left.
func (s *Service) capture(ctx context.Context, fk runtime.Forker, e *entry, name string) (TemplateInfo, error) {
	start := time.Now()
	s.mu.Lock()
	h, id, specJSON, spec := e.handle, e.rec.ID, e.rec.Spec, e.spec
	s.mu.Unlock()
	prefix := fmt.Sprintf("templates/%s/%d/", name, time.Now().UnixNano())
	m, err := s.writeSnapshot(ctx, fk, h, id, prefix, specJSON, spec, start)
	undoCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), rollbackTimeout)
	defer cancel()
	if terr := fk.Thaw(undoCtx, h); terr != nil && err == nil {
		err = fmt.Errorf("thaw: %w", terr)
	}
	if kept := (*saveKeptError)(nil); errors.As(err, &kept) && !errors.Is(stoppedBy(ctx, err), errDeleted) {
		s.restartKeptSave(e, h, kept)
	}
	note := templateNote{Size: snapshotBytes(m), NotSaved: m.NotSaved, CaptureMs: ms(time.Since(start))}
	nb, _ := json.Marshal(note)
	t := store.Template{Name: name, From: id, CreatedAt: time.Now().UTC(), Snapshot: prefix, Spec: specJSON, Info: nb}
	if err == nil {
		err = s.cfg.Store.AddTemplate(ctx, t)
	}
	if err != nil {
		if derr := s.cfg.Snapshots.Delete(undoCtx, prefix); derr != nil {
			s.log.Warn("template capture failed: delete the partial snapshot", "template", name, "err", derr)
		}
		return TemplateInfo{}, err
	}
	return templateInfo(t), nil
}

func templateInfo(t store.Template) TemplateInfo {
	var note templateNote
	json.Unmarshal(t.Info, &note) //nolint:errcheck // written by us
	in := TemplateInfo{Name: t.Name, From: t.From, CreatedAt: t.CreatedAt, Size: note.Size, NotSaved: note.NotSaved,
		CaptureMs: note.CaptureMs}
	json.Unmarshal(t.Spec, &in.Spec) //nolint:errcheck // written by us
	if in.NotSaved == nil {
		in.NotSaved = []agent.Skipped{}
	}
	return in
}

// GetTemplate returns one template.
func (s *Service) GetTemplate(ctx context.Context, name string) (TemplateInfo, error) {
	if err := ValidTemplateName(name); err != nil {
		return TemplateInfo{}, errdefs.New(errdefs.ErrNotFound, fmt.Sprintf("template %q not found", name))
	}
	t, err := s.cfg.Store.GetTemplate(ctx, name)
	if err != nil {
		return TemplateInfo{}, err
	}
	return templateInfo(t), nil
}

// ListTemplates returns every template, by name.
func (s *Service) ListTemplates(ctx context.Context) ([]TemplateInfo, error) {
	ts, err := s.cfg.Store.ListTemplates(ctx)
	if err != nil {
		return nil, err
	}
	out := make([]TemplateInfo, len(ts))
	for i, t := range ts {
		out[i] = templateInfo(t)
	}
	return out, nil
}

// DeleteTemplate removes a template: its record, then its snapshot. It waits for creates reading it. Sandboxes
// created from it are not affected.
func (s *Service) DeleteTemplate(ctx context.Context, name string) error {
	if err := ValidTemplateName(name); err != nil {
		return errdefs.New(errdefs.ErrNotFound, fmt.Sprintf("template %q not found", name))
	}
	l := s.tmpl.of(name)
	l.Lock()
	defer l.Unlock()
	t, err := s.cfg.Store.GetTemplate(ctx, name)
	if err != nil {
		return err
	}
	if err := s.cfg.Store.DeleteTemplate(ctx, name); err != nil {
		return err
	}
	s.mu.Lock()
	warm := s.tmplWarm[name]
	delete(s.tmplWarm, name)
	s.mu.Unlock()
	for _, e := range warm {
		s.dropWarm(e)
	}
	if s.cfg.Snapshots != nil {
		if err := s.cfg.Snapshots.Delete(ctx, t.Snapshot); err != nil {
			s.log.Warn("template deleted; its snapshot was not", "template", name, "prefix", t.Snapshot, "err", err)
		}
	}
	s.log.Info("template deleted", "template", name)
	return nil
}

// createFromTemplate starts a new sandbox from template req.Template: its own id and address, the template's
// spec with the fields req sets in its place, the template's files and interpreter session.
func (s *Service) createFromTemplate(ctx context.Context, req CreateRequest) (Info, error) {
	if err := s.snapshots(); err != nil {
		return Info{}, err
	}
	if err := ValidTemplateName(req.Template); err != nil {
		return Info{}, err
	}
	l := s.tmpl.of(req.Template)
	l.RLock()
	defer l.RUnlock()
	t, err := s.cfg.Store.GetTemplate(ctx, req.Template)
	if err != nil {
		return Info{}, err
	}
	spec, err := templateSpec(t.Spec, req)
	if err != nil {
		return Info{}, err
	}
	releaseImage, err := s.useImage(spec.Image)
	if err != nil {
		return Info{}, fmt.Errorf("template %s: %w", t.Name, err)
	}
	defer releaseImage()
	if err := s.fitsHost(spec); err != nil {
		return Info{}, err
	}
	s.mu.Lock()
	err = s.admitLocked(spec, 1)
	var one []*entry // the template pool's first ready sandbox, if any
	if w := s.tmplWarm[t.Name]; err == nil && len(w) > 0 {
		one, s.tmplWarm[t.Name] = w[:1], w[1:]
	}
	s.mu.Unlock()
	if err != nil {
		return Info{}, err
	}
	defer s.kickTemplatePool(t.Name)
	if info, ok := s.claimFrom(ctx, &one, spec); ok {
		return info, nil
	}
	return s.createAs(ctx, spec, StatusRunning, s.restoreFrom(t))
}

// restoreFrom is createAs's start for a sandbox from template t.
func (s *Service) restoreFrom(t store.Template) func(context.Context, *entry) (runtime.Handle, error) {
	return func(ctx context.Context, e *entry) (runtime.Handle, error) {
		_, h, notRestored, err := s.restore(ctx, e, t.Snapshot, time.Now())
		if len(notRestored) > 0 {
			s.log.Warn("template: variables not restored", "template", t.Name, "sandbox", e.rec.ID, "n", len(notRestored))
		}
		return h, err
	}
}

// A template pool keeps Config.TemplatePool sandboxes per template restored ahead of time (status warm,
// invisible to the API, like the plain warm pool's), so that a create from the template only configures one
// (claimFrom): milliseconds instead of a restore. Each holds the template's session in memory. A pool is filled
// after a capture, after each claim and at start (warm sandboxes do not survive a restart), and dropped with
// its template and at Close.

// kickTemplatePool fills name's pool in the background, unless another goroutine already does.
func (s *Service) kickTemplatePool(name string) {
	if s.cfg.TemplatePool > 0 {
		s.goBackground(func() { s.fillTemplatePool(name) })
	}
}

// fillTemplatePool restores sandboxes of template name until its pool is full. It holds the template shared
// (a delete waits for it, then drops what it made).
func (s *Service) fillTemplatePool(name string) {
	s.mu.Lock()
	if s.tmplFilling[name] {
		s.mu.Unlock()
		return
	}
	s.tmplFilling[name] = true
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.tmplFilling, name)
		s.mu.Unlock()
	}()
	l := s.tmpl.of(name)
	l.RLock()
	defer l.RUnlock()
	t, err := s.cfg.Store.GetTemplate(s.ctx, name)
	if err != nil {
		return // deleted meanwhile
	}
	spec, err := templateSpec(t.Spec, CreateRequest{Template: name})
	if err != nil {
		s.log.Warn("template pool", "template", name, "err", err)
		return
	}
	for s.ctx.Err() == nil {
		s.mu.Lock()
		full := len(s.tmplWarm[name]) >= s.cfg.TemplatePool
		s.mu.Unlock()
		if full {
			return
		}
		info, err := s.createAs(s.ctx, spec, StatusWarm, s.restoreFrom(t))
		if err != nil {
			if s.ctx.Err() == nil {
				s.log.Warn("template pool: restore a sandbox", "template", name, "err", err)
			}
			return
		}
		s.mu.Lock()
		if e := s.items[info.ID]; e != nil {
			s.tmplWarm[name] = append(s.tmplWarm[name], e)
		}
		s.mu.Unlock()
	}
}

// startTemplatePools fills every template's pool (New).
func (s *Service) startTemplatePools(ctx context.Context) {
	if s.cfg.TemplatePool <= 0 {
		return
	}
	ts, err := s.cfg.Store.ListTemplates(ctx)
	if err != nil {
		s.log.Warn("template pools", "err", err)
		return
	}
	for _, t := range ts {
		s.kickTemplatePool(t.Name)
	}
}

// dropTemplatePools destroys the templates' ready sandboxes (Close, once background work has stopped).
func (s *Service) dropTemplatePools() {
	s.mu.Lock()
	pools := s.tmplWarm
	s.tmplWarm = map[string][]*entry{}
	s.mu.Unlock()
	for _, warm := range pools {
		for _, e := range warm {
			s.dropWarm(e)
		}
	}
}

// templateSpec is a template's spec with every field req sets (non-zero; egress non-null; ingress_enabled
// true) in place of the template's, normalised.
func templateSpec(base json.RawMessage, req CreateRequest) (CreateRequest, error) {
	var spec CreateRequest
	if err := json.Unmarshal(base, &spec); err != nil {
		return spec, fmt.Errorf("template %s: corrupt spec: %w", req.Template, err)
	}
	over := func(dst *int, v int) {
		if v != 0 {
			*dst = v
		}
	}
	if req.VCPU != 0 {
		spec.VCPU = req.VCPU
	}
	over(&spec.MemMiB, req.MemMiB)
	over(&spec.MaxProcs, req.MaxProcs)
	over(&spec.DiskMiB, req.DiskMiB)
	over(&spec.TimeoutS, req.TimeoutS)
	if req.OnTimeout != "" {
		spec.OnTimeout = req.OnTimeout
	}
	if req.Env != nil {
		spec.Env = req.Env
	}
	if req.Cwd != "" {
		spec.Cwd = req.Cwd
	}
	if req.Metadata != nil {
		spec.Metadata = req.Metadata
	}
	if req.Egress != nil {
		spec.Egress = req.Egress
	}
	if req.IngressEnabled {
		spec.IngressEnabled = true
	}
	spec.Template = req.Template
	if req.Image != "" && imageName(req.Image) != spec.Image {
		return spec, invalid("template %s runs on image %q: a sandbox created from it cannot ask for image %q", req.Template,
			cmp.Or(spec.Image, image.DefaultName), req.Image)
	}
	return spec.normalize()
}

// reclaimTemplates deletes, when the snapshot store is this server's alone, the template snapshots
// ("templates/<name>/<time>/") that no template record names: captures cut short, deletes interrupted after the
// record went. It returns how many it deleted. (Called at start, before any capture can run.)
func (s *Service) reclaimTemplates(ctx context.Context) int {
	if !s.cfg.SnapshotsExclusive {
		return 0
	}
	ts, err := s.cfg.Store.ListTemplates(ctx)
	if err != nil {
		s.log.Warn("reclaim template snapshots: list templates", "err", err)
		return 0
	}
	objs, err := s.cfg.Snapshots.List(ctx, "templates/")
	if err != nil {
		s.log.Warn("reclaim template snapshots: list", "err", err)
		return 0
	}
	keep := map[string]bool{}
	for _, t := range ts {
		keep[t.Snapshot] = true
	}
	doomed := map[string]bool{}
	for _, o := range objs {
		parts := strings.SplitN(o.Key, "/", 4)
		if len(parts) < 4 {
			continue
		}
		if prefix := strings.Join(parts[:3], "/") + "/"; !keep[prefix] {
			doomed[prefix] = true
		}
	}
	n := 0
	for prefix := range doomed {
		if err := s.cfg.Snapshots.Delete(ctx, prefix); err != nil {
			s.log.Warn("reclaim template snapshot", "prefix", prefix, "err", err)
			continue
		}
		n++
	}
	return n
}
