// Package sandbox is ramify's sandbox service: sandbox ids, records and their lifecycle state machine, and every
// operation the API offers (create, list, destroy, run code, exec, files, fork, merge, diff), each checked
// against one transition table and serialised per sandbox. It owns no mechanism itself: processes and namespaces
// are the runtime's, records the store's.
package sandbox

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sort"
	"sync"
	"time"

	"github.com/ramify-dev/ramify/internal/agent"
	"github.com/ramify-dev/ramify/internal/crashpoint"
	"github.com/ramify-dev/ramify/internal/errdefs"
	"github.com/ramify-dev/ramify/internal/events"
	"github.com/ramify-dev/ramify/internal/files"
	"github.com/ramify-dev/ramify/internal/image"
	"github.com/ramify-dev/ramify/internal/runtime"
	"github.com/ramify-dev/ramify/internal/snapstore"
	"github.com/ramify-dev/ramify/internal/store"
)

// pauseInterruptedByRestart is the pause error of a sandbox whose pause a server restart cut short, running again.
const pauseInterruptedByRestart = "pause interrupted by a server restart"

// IPAllocator hands out sandbox addresses.
type IPAllocator interface {
	Allocate(inUse func(net.IP) bool) (net.IP, error)
}

// Config wires the service.
type Config struct {
	Store   *store.Store
	Runtime runtime.Runtime
	IPs     IPAllocator
	Logger  *slog.Logger
	// HostUID/HostGID own files written through the files API (container root).
	HostUID, HostGID int
	// WarmPool is how many pre-started sandboxes to keep ready for Create (0 = none).
	WarmPool int
	// TemplatePool is how many sandboxes to keep restored ahead of time per template (0 = none; template.go).
	TemplatePool int
	// Snapshots is where pauses write their snapshots (nil: pause is unavailable).
	Snapshots snapstore.Store
	// SnapshotsExclusive says that no other server uses Snapshots (the default local store in the data
	// directory): at start, snapshots of sandboxes this server has no record of, and temporary files of
	// unfinished writes, are removed too (see reclaim.go).
	SnapshotsExclusive bool
	// DiskMiB is the disk quota of sandboxes created without disk_mib (0: DefaultDiskMiB).
	DiskMiB int
	// CloseTimeout bounds how long Close waits for background work (pauses, resumes, timeout actions, the
	// pool) after cancelling it; 0 means DefaultCloseTimeout.
	CloseTimeout time.Duration
	// MemOvercommit and CPUOvercommit bound the totals of live sandboxes' mem_mib and vcpu, as multiples of the
	// host's memory and CPUs (0: DefaultMemOvercommit, DefaultCPUOvercommit); past them create, fork and resume
	// answer 503 (see capacity.go).
	MemOvercommit, CPUOvercommit float64
	// HostCPUs and HostMemMiB override what the host is taken to have (0: read from the host).
	HostCPUs, HostMemMiB int
	// Events receives the lifecycle events (observe.go); nil: none are published.
	Events *events.Hub
	// IngressHost is the ingress listener's public host (domain and port, "localhost:7080"); empty: no ingress
	// listener (the API's ports route still serves ingress-enabled sandboxes).
	IngressHost string
	// ImageDir is the images directory (internal/image): the default image and the named ones. Empty: only the
	// default image, and no image operations.
	ImageDir string
	// SSHAddr is the SSH server's public address (host:port); empty: no SSH server (ssh.go).
	SSHAddr string
	// SSHHostKey is the SSH server's public host key ("ssh-ed25519 AAAA..."), shown for known_hosts.
	SSHHostKey string
	// ForkAhead is the most children made ahead of forks at once, across all sandboxes (ahead.go); 0: none.
	ForkAhead int
	// InterpreterStall is how long a pause waits for the interpreter's next bytes of its session before it fails
	// (saveSession); 0: runtime.DefaultInterpreterStall. (The runtime bounds a fork's wait for the interpreter
	// by its own setting.)
	InterpreterStall time.Duration
}

// DefaultCloseTimeout is Config.CloseTimeout's default.
const DefaultCloseTimeout = 30 * time.Second

// Service is the sandbox service.
type Service struct {
	cfg  Config
	host hostShape // what this host has (capacity.go)
	log  *slog.Logger

	mu      sync.Mutex // guards entries and IP allocation
	items   map[string]*entry
	retired map[string]store.Retired // ids merged away or deleted, for a 404 that says so

	// ctx is the service's life: background work (pause, resume, timeout actions, the pool) runs on it, and
	// Close cancels it.
	ctx     context.Context
	cancel  context.CancelFunc
	wg      sync.WaitGroup // background work; Add only through goBackground
	closing bool           // guarded by mu: Close has begun, no background work starts any more

	warm    []*entry      // guarded by mu: ready pre-started sandboxes
	filling bool          // guarded by mu: a refill goroutine runs
	refill  chan struct{} // wakes the refill goroutine

	// Guarded by mu (ahead.go): the children made ahead of sandboxes that forked, by parent id; how many
	// children the sets being made will have; how many were made, used and dropped since start.
	aheads       map[string]*ahead
	aheadPending int
	aheadCount   struct{ made, used, dropped int64 }

	tmpl        templateLocks       // one lock per template name (template.go)
	tmplWarm    map[string][]*entry // guarded by mu: each template's ready restored sandboxes
	tmplFilling map[string]bool     // guarded by mu: templates whose pool a goroutine fills

	imgMu    sync.RWMutex    // images.go: shared by creates on named images, exclusive by removal
	building map[string]bool // guarded by mu: named images being built

	healing map[string]bool // guarded by mu: sandboxes the health watcher is restarting (health.go)
}

// entry is the in-memory state of one sandbox.
type entry struct {
	// op serialises lifecycle operations (exclusive) against uses (shared: run_code, exec, files).
	op sync.RWMutex
	// keep serialises SetTimeout calls (which hold op shared).
	keep sync.Mutex

	// guarded by Service.mu
	rec    store.Record
	spec   CreateRequest
	handle runtime.Handle
	timer  *time.Timer
	// timeoutFrom is what timeout_s counts from when SetTimeout set it (zero: created_at); stored in the spec.
	timeoutFrom time.Time
	gone        bool          // destroyed or merged away: lookups fail from now on
	changed     chan struct{} // closed at the next status change or retirement (see notify); nil when none waits
	pooled      bool          // a warm-pool sandbox (being started or ready): invisible to the API until claimed
	// aheadN is how many children its next children made ahead are (its last fork's n; 0: none), aheadTries how
	// many more sets of them may go unused, aheadTimer the timer that makes them (ahead.go).
	aheadN, aheadTries int
	aheadTimer         *time.Timer
	// abort stops the work that holds the sandbox exclusively, if any: a pause or resume in the background, a
	// fork, a template's capture, children being made ahead (a delete does: see destroy, stoppable).
	abort context.CancelCauseFunc
	// uses cancels the calls holding the sandbox shared (use, a diff: stoppedByDelete), for a delete to stop them.
	uses map[*int]context.CancelCauseFunc
	// lostState says why the sandbox's interpreter state was lost by a restart of its processes (health.go), until
	// the next run_code reports it (as it reports an interpreter that died between calls) instead of running.
	lostState string
	// prog is how far the pause or resume in flight has got (nil: none).
	prog *progress
}

// New builds the service and reconciles the records with what is running: sandboxes that survived a restart
// are re-attached, the others are marked error with the reason.
func New(ctx context.Context, cfg Config) (*Service, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if cfg.CloseTimeout <= 0 {
		cfg.CloseTimeout = DefaultCloseTimeout
	}
	if cfg.MemOvercommit <= 0 {
		cfg.MemOvercommit = DefaultMemOvercommit
	}
	if cfg.CPUOvercommit <= 0 {
		cfg.CPUOvercommit = DefaultCPUOvercommit
	}
	s := &Service{cfg: cfg, log: cfg.Logger, items: map[string]*entry{}, aheads: map[string]*ahead{}, refill: make(chan struct{}, 1), host: detectHost(),
		tmplWarm: map[string][]*entry{}, tmplFilling: map[string]bool{}, building: map[string]bool{}}
	if cfg.HostCPUs > 0 {
		s.host.cpus = cfg.HostCPUs
	}
	if cfg.HostMemMiB > 0 {
		s.host.memMiB = cfg.HostMemMiB
	}
	s.ctx, s.cancel = context.WithCancel(context.Background())
	recs, err := cfg.Store.List(ctx)
	if err != nil {
		return nil, fmt.Errorf("load sandboxes: %w", err)
	}
	retired, err := cfg.Store.ListRetired(ctx)
	if err != nil {
		return nil, fmt.Errorf("load retired sandbox ids: %w", err)
	}
	s.retired = make(map[string]store.Retired, len(retired))
	for _, r := range retired {
		s.retired[r.ID] = r
	}
	var loaded []*entry
	// Leftovers are stopped once every record has been recovered: stopping one earlier could take for the last
	// member of its family a sandbox whose live siblings are not recovered yet, and kill their family init.
	var stops []func()
	stopLater := func(e *entry) {
		h := e.handle
		if h.ID == "" {
			h.ID, h.FamilyID = e.rec.ID, e.rec.FamilyID // interrupted before it had a handle
		}
		stops = append(stops, func() { s.stopQuietly(e.rec.ID, h) })
	}
	for _, rec := range recs {
		e := &entry{rec: rec}
		json.Unmarshal(rec.Spec, &e.spec) //nolint:errcheck // written by us
		var tf timeoutOfSpec
		if json.Unmarshal(rec.Spec, &tf) == nil && tf.TimeoutFrom != nil {
			e.timeoutFrom = *tf.TimeoutFrom
		}
		json.Unmarshal(rec.Handle, &e.handle) //nolint:errcheck
		switch Status(rec.Status) {
		case StatusWarm:
			// Pre-started sandboxes are not worth recovering: destroy them and start fresh ones.
			if e.handle.ID == "" {
				e.handle.ID, e.handle.FamilyID = rec.ID, rec.FamilyID // interrupted before it had a handle
			}
			if err := cfg.Runtime.Destroy(ctx, e.handle); err != nil {
				s.log.Warn("destroy warm sandbox left from the last run", "sandbox", rec.ID, "err", err)
			}
			cfg.Store.Delete(ctx, rec.ID) //nolint:errcheck // best effort
			continue
		case StatusRunning:
			if err := cfg.Runtime.Recover(ctx, e.handle); err != nil {
				s.log.Warn("sandbox did not survive the restart", "sandbox", rec.ID, "err", err)
				stopLater(e)
				s.recoverAs(e, StatusError)
				e.rec.Error = "lost when the server restarted: " + err.Error()
				cfg.Store.Put(ctx, e.rec) //nolint:errcheck // best effort; the in-memory state is right
			} else {
				s.log.Info("sandbox recovered", "sandbox", rec.ID)
				if es, ok := cfg.Runtime.(runtime.EgressSetter); ok && e.spec.Egress != nil {
					// The kernel kept the policy's elements; this gives the runtime its hostnames to re-resolve.
					if err := es.SetEgress(ctx, e.handle, e.spec.Egress); err != nil {
						s.log.Warn("restore the egress policy", "sandbox", rec.ID, "err", err)
					}
				}
			}
		case StatusPausing:
			// The pause was cut short: the sandbox may well still run; then it simply stays running (Recover
			// thaws it if the pause had frozen it).
			if err := cfg.Runtime.Recover(ctx, e.handle); err == nil {
				s.recoverAs(e, StatusRunning)
				pi := s.pauseInfo(e)
				pi.Error = pauseInterruptedByRestart
				s.setPauseInfo(e, pi)
			} else if rec.Snapshot != "" {
				// The snapshot was complete and the sandbox already freed: it is paused.
				stopLater(e)
				s.recoverAs(e, StatusPaused)
				e.rec.Handle, e.handle = nil, runtime.Handle{}
			} else {
				stopLater(e)
				s.recoverAs(e, StatusError)
				e.rec.Error = "interrupted by a server restart while pausing: " + err.Error()
			}
			cfg.Store.Put(ctx, e.rec) //nolint:errcheck
		case StatusResuming:
			// Interrupted before its commit (which records it running): what the resume made of it is stopped
			// here and removed by reclaim (a paused sandbox owns nothing but its snapshot), and it is paused
			// again with its snapshot, as before the resume.
			stopLater(e)
			if rec.Snapshot != "" {
				s.recoverAs(e, StatusPaused)
				e.rec.Handle, e.handle = nil, runtime.Handle{}
				pi := s.pauseInfo(e)
				pi.Error = "resume failed: interrupted by a server restart (the sandbox is paused again: resume it)"
				s.setPauseInfo(e, pi)
			} else {
				s.recoverAs(e, StatusError)
				e.rec.Error = "interrupted by a server restart while resuming"
			}
			cfg.Store.Put(ctx, e.rec) //nolint:errcheck
		case StatusCreating:
			// Interrupted half-way by the restart: nothing usable is left.
			stopLater(e)
			s.recoverAs(e, StatusError)
			e.rec.Error = "interrupted by a server restart while " + rec.Status
			cfg.Store.Put(ctx, e.rec) //nolint:errcheck
		}
		s.items[rec.ID] = e
		loaded = append(loaded, e)
	}
	for _, stop := range stops {
		stop()
	}
	// What no record owns is left over from work the last server did not finish.
	s.reclaim(ctx)
	// Timers last: an overdue one fires at once, and its action changes s.items.
	for _, e := range loaded {
		s.armTimer(e)
	}
	if cfg.WarmPool > 0 {
		s.goBackground(s.fillPool)
		s.kickPool()
	}
	s.startTemplatePools(ctx)
	if h, ok := cfg.Runtime.(runtime.Healer); ok {
		s.goBackground(func() { s.watchHealth(h) })
	}
	if rp, ok := cfg.Runtime.(runtime.ResumePreparer); ok {
		s.goBackground(func() { s.keepResumesReady(rp) })
	}
	return s, nil
}

// recoverAs moves a record read at start-up to status to (New owns e alone: no lock needed).
func (s *Service) recoverAs(e *entry, to Status) {
	if err := s.setStatus(e, to); err != nil {
		s.log.Error("recover: refused by the state table", "sandbox", e.rec.ID, "err", err)
	}
}

// goBackground runs f in a goroutine that Close waits for, unless Close has begun (then it returns false and
// f does not run). The check and the WaitGroup's Add happen under s.mu, which Close takes to set closing, so
// no Add can race with Close's Wait.
func (s *Service) goBackground(f func()) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	if !s.enterLocked() {
		return false
	}
	go func() {
		defer s.wg.Done()
		f()
	}()
	return true
}

// enterLocked counts one piece of background work (the caller calls s.wg.Done when it ends) unless Close has
// begun. The caller holds s.mu.
func (s *Service) enterLocked() bool {
	if s.closing {
		return false
	}
	s.wg.Add(1)
	return true
}

var errClosing = errdefs.New(errdefs.ErrConflict, "the server is shutting down")

// retire makes e unknown to the API (destroyed, merged away, or rolled back): lookups fail, its timer stops and
// its waiters wake. The caller holds s.mu.
func (s *Service) retire(e *entry) {
	e.gone = true
	if e.timer != nil {
		e.timer.Stop()
	}
	if s.items[e.rec.ID] == e {
		delete(s.items, e.rec.ID)
	}
	s.notify(e)
}

// stopQuietly kills whatever may be left of a sandbox's processes, keeping its layer so its files are not lost.
func (s *Service) stopQuietly(id string, h runtime.Handle) {
	if st, ok := s.cfg.Runtime.(interface {
		Stop(context.Context, runtime.Handle) error
	}); ok {
		if err := st.Stop(context.Background(), h); err != nil {
			s.log.Warn("stop leftovers", "sandbox", id, "err", err)
		}
	}
}

// Close stops timers and the warm pool, cancels background work (pauses and resumes in progress roll back)
// and waits for it, at most Config.CloseTimeout; sandboxes keep running for the next server (which destroys the
// warm ones). Closing twice is harmless.
func (s *Service) Close() {
	s.mu.Lock()
	if s.closing {
		s.mu.Unlock()
		return
	}
	s.closing = true
	for _, e := range s.items {
		if e.timer != nil {
			e.timer.Stop()
		}
		if e.aheadTimer != nil {
			e.aheadTimer.Stop()
		}
	}
	s.mu.Unlock()
	s.cancel()
	done := make(chan struct{})
	go func() { s.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(s.cfg.CloseTimeout):
		s.log.Error("close: background work still running; not waiting any longer", "waited", s.cfg.CloseTimeout)
	}
	// Spare sandboxes are not left running while no server can hand them out.
	s.mu.Lock()
	warm := s.warm
	s.warm = nil
	s.mu.Unlock()
	for _, e := range warm {
		s.dropWarm(e)
	}
	s.mu.Lock()
	var kids []*entry
	for id := range s.aheads {
		kids = append(kids, s.takeAheadLocked(id).kids...)
	}
	s.mu.Unlock()
	s.dropKids(kids, true)
	s.dropTemplatePools()
}

var errNotFound = errdefs.New(errdefs.ErrNotFound, "sandbox not found")

func (s *Service) lookup(id string) (*entry, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.items[id]
	if e == nil || e.gone || e.pooled {
		return nil, s.notFound(id)
	}
	return e, nil
}

// notFound is the error for an id that names no sandbox: it says what became of a sandbox merged away or
// deleted (following a chain of merges to the id that holds its state now). Called with s.mu held.
func (s *Service) notFound(id string) error {
	r, ok := s.retired[id]
	if !ok {
		return errNotFound
	}
	if r.MergedInto == "" {
		return errdefs.New(errdefs.ErrNotFound, fmt.Sprintf("sandbox %s was %s at %s", id, r.Reason,
			r.At.UTC().Format(time.RFC3339)))
	}
	msg := fmt.Sprintf("sandbox %s was merged into %s at %s", id, r.MergedInto, r.At.UTC().Format(time.RFC3339))
	now := r.MergedInto
	for i := 0; i < 64; i++ { // a merged parent may itself have been merged into its own parent since
		next, ok := s.retired[now]
		if !ok {
			msg += fmt.Sprintf("; its state lives on under %s: use id %s", now, now)
			break
		}
		if next.MergedInto == "" {
			msg += fmt.Sprintf("; %s was since %s at %s", now, next.Reason, next.At.UTC().Format(time.RFC3339))
			break
		}
		msg += fmt.Sprintf(", and %s since into %s", now, next.MergedInto)
		now = next.MergedInto
	}
	return errdefs.New(errdefs.ErrNotFound, msg)
}

// status reads e's status.
func (s *Service) status(e *entry) Status {
	s.mu.Lock()
	defer s.mu.Unlock()
	return Status(e.rec.Status)
}

func (s *Service) info(e *entry) Info {
	r, spec := e.rec, e.spec
	in := Info{
		ID: r.ID, Status: Status(r.Status), IP: r.IP, Hostname: r.Hostname,
		VCPU: spec.VCPU, MemMiB: spec.MemMiB, MaxProcs: spec.MaxProcs, Shape: shape(spec.VCPU, spec.MemMiB),
		TimeoutS: spec.TimeoutS, OnTimeout: spec.OnTimeout, Cwd: spec.Cwd, Metadata: spec.Metadata,
		CreatedAt: r.CreatedAt, FamilyID: r.FamilyID, Error: r.Error,
	}
	in.Egress = spec.Egress
	in.Ingress = s.ingressInfo(r.ID, spec)
	in.DiskMiB = spec.DiskMiB
	in.Template = spec.Template
	in.Image = spec.Image
	if in.Image == "" {
		in.Image = image.DefaultName
	}
	in.SSH = s.sshInfo(r.ID, spec)
	if in.Metadata == nil {
		in.Metadata = map[string]string{}
	}
	if spec.TimeoutS > 0 {
		t := timeoutBase(e).Add(time.Duration(spec.TimeoutS) * time.Second)
		in.ExpiresAt = &t
	}
	if r.ParentID != "" {
		p := r.ParentID
		in.ParentID = &p
	}
	if r.ForkedFrom != "" {
		p := r.ForkedFrom
		in.ForkedFrom = &p
	}
	if len(r.Pause) > 2 {
		pi := s.pauseInfo(e)
		pi.Preload = nil // the service's own
		in.Pause = &pi
	}
	if in.Status == StatusPausing || in.Status == StatusResuming {
		in.Progress = e.prog.view()
	}
	return in
}

// Get returns one sandbox, with its resource use now when it runs.
func (s *Service) Get(ctx context.Context, id string) (Info, error) {
	e, err := s.lookup(id)
	if err != nil {
		return Info{}, err
	}
	s.mu.Lock()
	in, h := s.info(e), e.handle
	s.mu.Unlock()
	if in.Status == StatusRunning {
		// Read outside s.mu: it reads cgroup files and, for the disk, the layer file system's qgroups.
		if u, err := s.cfg.Runtime.Usage(h); err == nil {
			in.Usage = usageOf(u)
		} else {
			s.log.Debug("usage", "sandbox", id, "err", err) // e.g. it stopped running meanwhile
		}
	}
	return in, nil
}

// UsageInfo is a running sandbox's resource use, as GET reports it.
type UsageInfo struct {
	MemBytes   uint64  `json:"mem_bytes"`
	CPUSeconds float64 `json:"cpu_seconds"`
	Pids       uint64  `json:"pids"`
	OOMKills   uint64  `json:"oom_kills"`
	// DiskBytes is what counts against disk_mib; null when the layer driver does not account per sandbox.
	DiskBytes *int64 `json:"disk_bytes"`
}

func usageOf(u runtime.Usage) *UsageInfo {
	in := &UsageInfo{MemBytes: u.MemoryBytes, CPUSeconds: float64(u.CPUNanos) / 1e9, Pids: u.Pids, OOMKills: u.OOMKills}
	if u.DiskBytes >= 0 {
		d := u.DiskBytes
		in.DiskBytes = &d
	}
	return in
}

// Wait returns the sandbox's info as soon as its status is want or error, or the pause or resume it waits for
// failed (pauseFailed, resumeFailed), or when timeout has passed or ctx ends (with the status it has then). It
// lets clients wait for a pause or resume without polling over HTTP.
func (s *Service) Wait(ctx context.Context, id string, want Status, timeout time.Duration) (Info, error) {
	switch want {
	case StatusCreating, StatusRunning, StatusPausing, StatusPaused, StatusResuming, StatusError:
	default:
		return Info{}, invalid("unknown status %q", want)
	}
	e, err := s.lookup(id)
	if err != nil {
		return Info{}, err
	}
	t := time.NewTimer(timeout)
	defer t.Stop()
	for {
		s.mu.Lock()
		if e.gone {
			err := s.notFound(id)
			s.mu.Unlock()
			return Info{}, err
		}
		info := s.info(e)
		changed := s.changes(e) // woken by setStatus and retire
		s.mu.Unlock()
		if info.Status == want || info.Status == StatusError || pauseFailed(info, want) || resumeFailed(info, want) {
			return info, nil
		}
		select {
		case <-ctx.Done():
			return info, nil
		case <-t.C:
			return info, nil
		case <-changed:
		}
	}
}

// destroyTimeout bounds a destroy once it has begun (a process the kernel will not let die, a store that does
// not answer): the sandbox is retired all the same, and what is left is logged and reclaimed at the next start.
const destroyTimeout = 2 * time.Minute

// errDeleted is why a delete stopped work on its sandbox: a pause or resume in progress, children being made
// ahead, the calls in flight (use).
var errDeleted = errors.New("the sandbox is being deleted")

// pauseFailed reports whether a wait for want can end because the pause it waits for failed: a failed pause
// leaves the sandbox running with pause.error set (a new pause clears it as it starts), so it would never be
// paused by that pause.
func pauseFailed(info Info, want Status) bool {
	return want == StatusPaused && info.Status == StatusRunning && info.Pause != nil && info.Pause.Error != ""
}

// resumeFailed reports whether a wait for want can end because the resume it waits for failed: a failed resume
// leaves the sandbox paused with pause.error set (a new resume clears it as it starts), so it would never be
// running by that resume.
func resumeFailed(info Info, want Status) bool {
	return want == StatusRunning && info.Status == StatusPaused && info.Pause != nil && info.Pause.Error != ""
}

// ListOptions filters List.
type ListOptions struct {
	Status   Status
	Metadata map[string]string
}

// List returns the sandboxes, oldest first.
func (s *Service) List(ctx context.Context, o ListOptions) []Info {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := []Info{}
outer:
	for _, e := range s.items {
		if e.gone || e.pooled || (o.Status != "" && Status(e.rec.Status) != o.Status) {
			continue
		}
		for k, v := range o.Metadata {
			if e.spec.Metadata[k] != v {
				continue outer
			}
		}
		out = append(out, s.info(e))
	}
	sort.Slice(out, func(i, j int) bool {
		if out[i].CreatedAt.Equal(out[j].CreatedAt) {
			return out[i].ID < out[j].ID
		}
		return out[i].CreatedAt.Before(out[j].CreatedAt)
	})
	return out
}

// allocateIP picks an address no live sandbox has. Caller holds s.mu.
func (s *Service) allocateIP() (net.IP, error) {
	used := map[string]bool{}
	for _, e := range s.items {
		if !e.gone && e.rec.IP != "" {
			used[e.rec.IP] = true
		}
	}
	return s.cfg.IPs.Allocate(func(ip net.IP) bool { return used[ip.String()] })
}

// Create makes and starts a sandbox.
func (s *Service) Create(ctx context.Context, req CreateRequest) (Info, error) {
	if req.Template != "" {
		return s.createFromTemplate(ctx, req)
	}
	if req.DiskMiB == 0 {
		req.DiskMiB = s.cfg.DiskMiB
	}
	spec, err := req.normalize()
	if err != nil {
		return Info{}, err
	}
	if err := s.fitsHost(spec); err != nil {
		return Info{}, err
	}
	s.mu.Lock()
	err = s.admitLocked(spec, 1)
	s.mu.Unlock()
	if err != nil {
		return Info{}, err
	}
	if spec.Image != "" { // the warm pool holds default-image sandboxes only
		release, err := s.useImage(spec.Image)
		if err != nil {
			return Info{}, err
		}
		defer release()
		return s.createCold(ctx, spec, StatusRunning)
	}
	if info, ok := s.claimWarm(ctx, spec); ok {
		return info, nil
	}
	return s.createCold(ctx, spec, StatusRunning)
}

// createCold starts a new sandbox from scratch; status is running, or warm for the pool.
func (s *Service) createCold(ctx context.Context, spec CreateRequest, status Status) (Info, error) {
	return s.createAs(ctx, spec, status, func(ctx context.Context, e *entry) (runtime.Handle, error) {
		return s.cfg.Runtime.Create(ctx, runtime.Spec{
			ID: e.rec.ID, Hostname: e.rec.Hostname, IP: parseIP(e.rec.IP), VCPU: spec.VCPU, MemMiB: spec.MemMiB,
			MaxProcs: spec.MaxProcs, DiskMiB: spec.DiskMiB, Env: spec.Env, Cwd: spec.Cwd, Egress: spec.Egress,
			Image: spec.Image,
		})
	})
}

// createAs makes a new sandbox of spec, reserving its id and address and recording it, and has start bring
// it up (from scratch, or from a template's snapshot); status is running, or warm for the pool. A failure
// undoes everything.
func (s *Service) createAs(ctx context.Context, spec CreateRequest, status Status,
	start func(context.Context, *entry) (runtime.Handle, error)) (Info, error) {
	id := NewID()
	specJSON, _ := json.Marshal(spec)
	s.mu.Lock()
	if status != StatusWarm {
		if err := s.admitLocked(spec, 1); err != nil {
			s.mu.Unlock()
			return Info{}, err
		}
	}
	ip, err := s.allocateIP()
	if err != nil {
		s.mu.Unlock()
		return Info{}, fmt.Errorf("create sandbox: %w", err)
	}
	initial := StatusCreating
	if status == StatusWarm {
		initial = StatusWarm // so that a restart mid-start destroys it like any warm sandbox
	}
	e := &entry{spec: spec, pooled: status == StatusWarm, rec: store.Record{
		ID: id, Status: string(initial), FamilyID: "fam_" + id[4:], IP: ip.String(), Hostname: hostnameOf(id),
		CreatedAt: time.Now().UTC(), Spec: specJSON,
	}}
	e.op.Lock()
	defer e.op.Unlock()
	s.items[id] = e // reserves the address
	s.mu.Unlock()

	var undo undoStack
	undo.push("reserve "+id, func(context.Context) error {
		s.mu.Lock()
		defer s.mu.Unlock()
		s.retire(e)
		return nil
	})
	fail := func(err error) (Info, error) {
		return Info{}, s.fail(ctx, &undo, fmt.Errorf("create sandbox: %w", err))
	}
	// Pushed first: a Put whose context ends as it commits may report an error for a record it wrote.
	undo.push("record of "+id, func(ctx context.Context) error { return s.cfg.Store.Delete(ctx, id) })
	if err := s.cfg.Store.Put(ctx, e.rec); err != nil {
		return fail(err)
	}
	begun := time.Now()
	h, err := start(ctx, e)
	if err != nil {
		return fail(err)
	}
	undo.push("sandbox "+id, func(ctx context.Context) error { return s.cfg.Runtime.Destroy(ctx, h) })
	hj, _ := json.Marshal(h)
	s.mu.Lock()
	e.handle = h
	e.rec.Handle = hj
	e.rec.FamilyID = h.FamilyID
	rec := e.rec
	if status != initial {
		rec.Status = string(status) // applied in memory once saved
	}
	s.mu.Unlock()
	if err := transition(id, initial, status); status != initial && err != nil {
		return fail(err)
	}
	if err := s.cfg.Store.Put(ctx, rec); err != nil {
		return fail(err)
	}
	if status != initial {
		s.mu.Lock()
		s.setStatus(e, status) //nolint:errcheck // checked above; e is held exclusively
		s.mu.Unlock()
	}
	if status == StatusWarm {
		s.log.Debug("warm sandbox ready", "sandbox", id, "ms", time.Since(begun).Milliseconds())
		s.mu.Lock()
		defer s.mu.Unlock()
		return s.info(e), nil
	}
	s.armTimer(e)
	s.log.Info("sandbox created", "sandbox", id, "ip", rec.IP, "template", spec.Template, "ms", time.Since(begun).Milliseconds())
	s.emit(events.Event{Type: events.Created, Sandbox: id, Family: rec.FamilyID, Status: string(status), Ms: msSince(begun)})
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.info(e), nil
}

// armTimer schedules the sandbox's timeout, if it has one.
func (s *Service) armTimer(e *entry) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.armTimerLocked(e)
}

// armTimerLocked is armTimer for a caller holding s.mu. The deadline is timeout_s after creation, or after the
// last SetTimeout.
func (s *Service) armTimerLocked(e *entry) {
	if e.spec.TimeoutS <= 0 || e.gone || e.timer != nil {
		return
	}
	id, onTimeout := e.rec.ID, e.spec.OnTimeout
	d := time.Until(timeoutBase(e).Add(time.Duration(e.spec.TimeoutS) * time.Second))
	e.timer = time.AfterFunc(max(d, 0), func() {
		// Tracked, so Close waits for it; refused once Close has begun.
		s.goBackground(func() { s.timeout(id, onTimeout) })
	})
}

// timeout is a sandbox's timeout action: destroy it, or pause it (on_timeout "pause").
func (s *Service) timeout(id, onTimeout string) {
	s.log.Info("sandbox timed out", "sandbox", id, "on_timeout", onTimeout)
	var err error
	if onTimeout == "pause" {
		err = s.pauseOnTimeout(s.ctx, id)
	} else {
		err = s.destroy(s.ctx, id, "destroyed when its timeout_s expired")
	}
	if err != nil && !errors.Is(err, errdefs.ErrNotFound) {
		s.log.Warn("timeout action failed", "sandbox", id, "err", err)
	}
}

// Delete destroys a sandbox: its processes, file system and record.
func (s *Service) Delete(ctx context.Context, id string) error {
	return s.destroy(ctx, id, "deleted")
}

// destroy is Delete; reason says why, to later callers of the id.
func (s *Service) destroy(ctx context.Context, id, reason string) error {
	// A pause or resume in progress would hold the sandbox until it ends, which a snapshot store or an
	// interpreter that stopped answering can put off for long: the delete stops it (it rolls back) first.
	if e, err := s.lookup(id); err == nil {
		s.mu.Lock()
		if e.abort != nil {
			e.abort(errDeleted)
		}
		for _, stop := range e.uses { // run_code, exec, diffs and the like in flight (stoppedByDelete)
			stop(errDeleted)
		}
		s.mu.Unlock()
	}
	es, release, err := s.acquire(exclusive, OpDestroy, id)
	if err != nil {
		return err
	}
	defer release()
	// Once it holds the sandbox the delete goes to its end, whether or not its caller still waits (half a
	// destroy would leave the sandbox listed in error), within destroyTimeout.
	ctx = context.WithoutCancel(ctx)
	dctx, cancel := context.WithTimeout(ctx, destroyTimeout)
	defer cancel()
	e := es[0]
	s.mu.Lock()
	h, snapshot := e.handle, e.rec.Snapshot
	if h.ID == "" {
		h = runtime.Handle{ID: id, FamilyID: e.rec.FamilyID}
	}
	s.mu.Unlock()
	// The record goes first: it is the delete's commit point. A server that dies from here on finishes the delete
	// as it starts (what no record owns is reclaimed: processes, cgroup, veth, layer, snapshot); the other way
	// round, it found the record of a half-destroyed sandbox and listed it in error. A store that cannot retire
	// it fails the delete with nothing done.
	gone := store.Retired{ID: id, Reason: reason, At: time.Now()}
	if err := s.cfg.Store.Retire(ctx, id, gone.Reason, gone.At); err != nil {
		return err
	}
	crashpoint.Hit(crashpoint.DestroyAfterRetire)
	if err := s.cfg.Runtime.Destroy(dctx, h); err != nil {
		s.log.Warn("destroy", "sandbox", id, "err", err)
	}
	s.mu.Lock()
	s.retire(e)
	s.retired[id] = gone
	s.mu.Unlock()
	if snapshot != "" && s.cfg.Snapshots != nil {
		s.dropSnapshot(snapshot) // a paused sandbox's: no record names it now
	}
	s.log.Info("sandbox destroyed", "sandbox", id, "reason", reason)
	s.emit(events.Event{Type: events.Destroyed, Sandbox: id, Family: h.FamilyID, Reason: reason})
	return nil
}

// stoppable returns ctx, ended by a delete of e (destroy calls e.abort, cause errDeleted), for work that holds e
// exclusively (a fork, a template's capture, children made ahead) and can wait long on e's interpreter; done,
// called before the hold is released, ends that.
func (s *Service) stoppable(ctx context.Context, e *entry) (context.Context, func()) {
	ctx, abort := context.WithCancelCause(ctx)
	s.mu.Lock()
	e.abort = abort
	s.mu.Unlock()
	return ctx, func() {
		s.mu.Lock()
		e.abort = nil
		s.mu.Unlock()
		abort(nil)
	}
}

// use takes a shared hold on a running sandbox for run_code, exec and files. The returned context is ctx, ended
// by a delete of the sandbox (with errDeleted as its cause): a delete stops the calls in flight, which would
// otherwise hold it for as long as they run (code in an endless loop, up to its timeout or for ever).
func (s *Service) use(ctx context.Context, id string) (context.Context, *entry, func(), error) {
	es, release, err := s.acquire(shared, OpUse, id)
	if err != nil {
		return nil, nil, nil, err
	}
	e := es[0]
	uctx, done := s.stoppedByDelete(ctx, e)
	return uctx, e, func() {
		done()
		release()
	}, nil
}

// stoppedByDelete returns ctx, ended by a delete of e (destroy calls e.uses, cause errDeleted), for a call that
// holds e shared (several may at once, unlike stoppable's exclusive work); done, called before the hold is
// released, ends that.
func (s *Service) stoppedByDelete(ctx context.Context, e *entry) (context.Context, func()) {
	uctx, cancel := context.WithCancelCause(ctx)
	key := new(int)
	s.mu.Lock()
	if e.uses == nil {
		e.uses = map[*int]context.CancelCauseFunc{}
	}
	e.uses[key] = cancel
	s.mu.Unlock()
	return uctx, func() {
		s.mu.Lock()
		delete(e.uses, key)
		s.mu.Unlock()
		cancel(nil)
	}
}

// RunCodeRequest is the body of run_code.
type RunCodeRequest struct {
	Code string `json:"code"`
	// Env is set in the interpreter's os.environ for this call only; what it replaced is restored after.
	Env      map[string]string `json:"env,omitempty"`
	TimeoutS *float64          `json:"timeout_s,omitempty"`
	Stream   bool              `json:"stream,omitempty"`
}

// Execution is run_code's result.
type Execution struct {
	Stdout         string           `json:"stdout"`
	Stderr         string           `json:"stderr"`
	Value          *string          `json:"value"`
	Error          *agent.ExecError `json:"error"`
	ExecutionCount int              `json:"execution_count"`
	// Results are the cell's rich results in order (execute_result, display_data), never null.
	Results []agent.Result `json:"results"`
	// Interrupted is true when POST /interrupt stopped the call (error is then a KeyboardInterrupt).
	Interrupted bool `json:"interrupted,omitempty"`
}

// DefaultTimeoutS bounds run_code and exec unless the caller says otherwise.
const DefaultTimeoutS = 300

func timeoutOf(t *float64) (float64, error) {
	if t == nil {
		return DefaultTimeoutS, nil
	}
	if *t < 0 || *t > 86400 {
		return 0, invalid("timeout_s must be between 0 and 86400")
	}
	return *t, nil
}

// agentGrace is how long past a call's own timeout_s the server waits for the agent's answer: the agent answers
// at the timeout (its code interrupted, or its command killed), or 10 s later when the code ignored the interrupt
// (the interpreter killed). An agent that says nothing by then is not running (stopped from the host, say).
const agentGrace = 15 * time.Second

// errAgentSilent ends a call whose agent did not answer within its timeout and agentGrace.
var errAgentSilent = errors.New("the sandbox's agent did not answer within the call's timeout_s")

// withAgentDeadline bounds a call with timeout_s timeout (0: none, and no bound) to timeout + agentGrace.
func withAgentDeadline(ctx context.Context, timeout float64) (context.Context, context.CancelFunc) {
	if timeout <= 0 {
		return ctx, func() {}
	}
	return context.WithTimeoutCause(ctx, time.Duration(timeout*float64(time.Second))+agentGrace, errAgentSilent)
}

// callError is err of a call on sandbox id made under ctx (use, withAgentDeadline), said plainly when a delete
// of the sandbox (a conflict) or the agent's silence (unavailable) ended it, else err as it is.
func callError(ctx context.Context, id string, err error) error {
	if err == nil {
		return nil
	}
	switch cause := context.Cause(ctx); {
	case errors.Is(cause, errAgentSilent):
		return errdefs.New(errdefs.ErrUnavailable, fmt.Sprintf("%v and %v more (stopped from the host?); the sandbox is left as it is", errAgentSilent, agentGrace))
	case errors.Is(cause, errDeleted):
		return errdefs.New(errdefs.ErrConflict, fmt.Sprintf("sandbox %s was deleted while the call ran", id))
	}
	return err
}

// OutputEvent is a chunk of streamed output, or (run_code) a rich result as it is displayed.
type OutputEvent struct {
	Type string `json:"type"` // stdout, stderr or display_data
	Data any    `json:"data"` // a string of output; display_data's mime bundle (map[string]json.RawMessage)
}

// RunCode runs Python in the sandbox's interpreter. onOutput, if set, gets output as it is produced.
func (s *Service) RunCode(ctx context.Context, id string, req RunCodeRequest, onOutput func(OutputEvent)) (Execution, error) {
	for k, v := range req.Env {
		if err := validEnv(k, v); err != nil {
			return Execution{}, err
		}
	}
	timeout, err := timeoutOf(req.TimeoutS)
	if err != nil {
		return Execution{}, err
	}
	ctx, e, done, err := s.use(ctx, id)
	if err != nil {
		return Execution{}, err
	}
	defer done()
	s.mu.Lock()
	lost := e.lostState
	e.lostState = ""
	s.mu.Unlock()
	if lost != "" {
		return Execution{Error: &agent.ExecError{Name: "InterpreterDied", Value: lost}, Results: []agent.Result{}}, nil
	}
	c, err := s.cfg.Runtime.Agent(e.rec.ID)
	if err != nil {
		return Execution{}, err
	}
	s.prepareFork(e)
	ctx, cancel := withAgentDeadline(ctx, timeout)
	defer cancel()
	ev, err := c.RunCode(ctx, agent.RunCodeRequest{Code: req.Code, Env: req.Env, TimeoutS: timeout}, forward(onOutput))
	if err != nil {
		return Execution{}, fmt.Errorf("run_code in %s: %w", id, callError(ctx, id, err))
	}
	results := ev.Results
	if results == nil {
		results = []agent.Result{}
	}
	return Execution{Stdout: ev.Stdout, Stderr: ev.Stderr, Value: ev.Value, Error: ev.Error, ExecutionCount: ev.ExecutionCount,
		Results: results, Interrupted: ev.WasInterrupted}, nil
}

// prepareFork lets the runtime ready e's family for a first fork (spare agents), as e's interpreter runs code:
// the sandboxes that run code are the ones that fork.
func (s *Service) prepareFork(e *entry) {
	fp, ok := s.cfg.Runtime.(runtime.ForkPreparer)
	if !ok {
		return
	}
	s.mu.Lock()
	h, spec := e.handle, e.spec
	s.mu.Unlock()
	fp.PrepareFork(h, runtime.Spec{VCPU: spec.VCPU, MemMiB: spec.MemMiB, MaxProcs: spec.MaxProcs})
}

func forward(on func(OutputEvent)) func(agent.Event) {
	if on == nil {
		return nil
	}
	return func(ev agent.Event) {
		switch {
		case ev.Type == "stdout" || ev.Type == "stderr":
			on(OutputEvent{Type: ev.Type, Data: ev.Data})
		case ev.Type == "display_data" && len(ev.Results) == 1:
			on(OutputEvent{Type: ev.Type, Data: ev.Results[0].Data})
		}
	}
}

// ExecRequest is the body of exec.
type ExecRequest struct {
	Cmd      string            `json:"cmd,omitempty"`
	Argv     []string          `json:"argv,omitempty"`
	Env      map[string]string `json:"env,omitempty"`
	Cwd      string            `json:"cwd,omitempty"`
	TimeoutS *float64          `json:"timeout_s,omitempty"`
	Stdin    string            `json:"stdin,omitempty"`
	Stream   bool              `json:"stream,omitempty"`
}

// ExecResult is exec's result.
type ExecResult struct {
	ExitCode int    `json:"exit_code"`
	Stdout   string `json:"stdout"`
	Stderr   string `json:"stderr"`
	TimedOut bool   `json:"timed_out"`
	// Interrupted is true when POST /interrupt stopped the command (it and everything it started were killed).
	Interrupted bool `json:"interrupted"`
}

// Exec runs a command in the sandbox.
func (s *Service) Exec(ctx context.Context, id string, req ExecRequest, onOutput func(OutputEvent)) (ExecResult, error) {
	if (req.Cmd == "") == (len(req.Argv) == 0) {
		return ExecResult{}, invalid("exactly one of cmd and argv is required")
	}
	if req.Cwd != "" && req.Cwd[0] != '/' {
		return ExecResult{}, invalid("cwd must be an absolute path")
	}
	for k, v := range req.Env {
		if err := validEnv(k, v); err != nil {
			return ExecResult{}, err
		}
	}
	timeout, err := timeoutOf(req.TimeoutS)
	if err != nil {
		return ExecResult{}, err
	}
	ctx, e, done, err := s.use(ctx, id)
	if err != nil {
		return ExecResult{}, err
	}
	defer done()
	c, err := s.cfg.Runtime.Agent(e.rec.ID)
	if err != nil {
		return ExecResult{}, err
	}
	ctx, cancel := withAgentDeadline(ctx, timeout)
	defer cancel()
	ev, err := c.Exec(ctx, agent.ExecRequest{Cmd: req.Cmd, Argv: req.Argv, Env: req.Env, Cwd: req.Cwd,
		TimeoutS: timeout, Stdin: req.Stdin}, forward(onOutput))
	if err != nil {
		return ExecResult{}, fmt.Errorf("exec in %s: %w", id, callError(ctx, id, err))
	}
	return ExecResult{ExitCode: ev.ExitCode, Stdout: ev.Stdout, Stderr: ev.Stderr, TimedOut: ev.TimedOut,
		Interrupted: ev.WasInterrupted}, nil
}

// Interrupt stops the run_code and exec calls in flight in a running sandbox (running, or queued for the
// interpreter) when it arrives; what is "run_code", "exec" or "" (both). Calls that arrive later run normally.
// It answers how many calls it stopped; each of them answers its caller as interrupted.
func (s *Service) Interrupt(ctx context.Context, id, what string) (agent.Interrupted, error) {
	switch what {
	case agent.InterruptAll, agent.InterruptRunCode, agent.InterruptExec:
	default:
		return agent.Interrupted{}, invalid("what must be %q, %q or omitted (both), not %q",
			agent.InterruptRunCode, agent.InterruptExec, what)
	}
	ctx, e, done, err := s.use(ctx, id)
	if err != nil {
		return agent.Interrupted{}, err
	}
	defer done()
	c, err := s.cfg.Runtime.Agent(e.rec.ID)
	if err != nil {
		return agent.Interrupted{}, err
	}
	n, err := c.Interrupt(ctx, agent.InterruptRequest{What: what})
	if err != nil {
		return agent.Interrupted{}, fmt.Errorf("interrupt %s: %w", id, err)
	}
	return n, nil
}

// FileCall is a files API call's hold on a running sandbox's file system (Files). A delete of the sandbox stops
// it: what OnStop arranged runs, so that the call's I/O with a client (an upload that trickles, a download the
// client does not read) ends instead of holding the delete back; Err then says the sandbox was deleted.
type FileCall struct {
	*files.FS
	id   string
	ctx  context.Context // ended by a delete of the sandbox (use)
	mu   sync.Mutex
	stop []func() // one per OnStop: keeps its f from running, or waits for it
	done func()
}

// Files opens the sandbox's file system for the files API; call Release when done.
func (s *Service) Files(ctx context.Context, id string) (*FileCall, error) {
	uctx, e, done, err := s.use(ctx, id)
	if err != nil {
		return nil, err
	}
	fs, err := files.Open(s.cfg.Runtime.RootPath(e.handle), s.cfg.HostUID, s.cfg.HostGID)
	if err != nil {
		done()
		return nil, fmt.Errorf("open file system of %s: %w", id, err)
	}
	return &FileCall{FS: fs, id: id, ctx: uctx, done: done}, nil
}

// OnStop has f run, on a goroutine of its own, if a delete of the sandbox stops the call before Release; f
// unblocks the call's I/O. Release waits for an f that has begun.
func (c *FileCall) OnStop(f func()) {
	ran := make(chan struct{})
	stop := context.AfterFunc(c.ctx, func() { defer close(ran); f() })
	c.mu.Lock()
	c.stop = append(c.stop, func() {
		if !stop() {
			<-ran
		}
	})
	c.mu.Unlock()
}

// Err is err of the call, said plainly (a conflict) if a delete of the sandbox stopped it.
func (c *FileCall) Err(err error) error { return callError(c.ctx, c.id, err) }

// Release ends the call's hold: after it, nothing OnStop arranged runs.
func (c *FileCall) Release() {
	c.mu.Lock()
	stops := c.stop
	c.stop = nil
	c.mu.Unlock()
	for _, stop := range stops {
		stop()
	}
	c.FS.Close()
	c.done()
}

func parseIP(s string) net.IP { return net.ParseIP(s) }
