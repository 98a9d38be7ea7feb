package namespaces

import (
	"context"
	"sync"
	"time"

	"github.com/ramify-dev/ramify/internal/runtime"
)

// Families started ahead (Config.PrestartFamilies): a sandbox created without a fork parent (a cold create, a
// resume, a template) needs a family of its own, and starting one, its init and then an agent, is two process
// starts before its interpreter can start (~40 ms of a ~95 ms cold create here). The runtime keeps that many
// families started, each with one spare agent set up as far as it can be (see agent.prepare) and placed in a
// cgroup of its own, and Create takes one: the spawn then claims the spare (a cgroup rename, the network, the
// root) instead of starting processes. A taken family is replaced in the background.
//
// A family started ahead is held by its init for prestartHold (op "hold"), then ends by itself if it was never
// given a sandbox (as any init given no work does, after idleInitLimit): the pool replaces families at half
// that age, so that Create never takes one about to end, and a server that dies leaves nothing for long (the
// next start's reclaim scan removes them at once).

// A resume whose session needs numpy (runtime.Spec.Preload) spends ~115 ms of CPU, most of its time, importing
// it. Once such a session was saved (a pause, a template: PrepareResume) or resumed, the pool also keeps, for
// prestartHold, one family whose zygote imported numpy ahead, started with a 1-vCPU sandbox's thread counts
// (the default shape; Create gives it only to such sandboxes on the default image). The sandbox's agent still
// starts a fresh interpreter if an import in the sandbox would not find numpy the same (its env, its cwd, its
// files: the interpreter checks, see agent.Client.Preload). The sandbox service calls PrepareResume again every
// few minutes, and as it starts, for the sessions of sandboxes still paused: the family stays for as long as one
// may be resumed.

// One such family serves one resume: a second resume soon after (a pause and resume in a loop, several paused
// sandboxes resumed together) finds its replacement still importing numpy (~0.5 s here) and loads the session
// cold. Each resume that found no family ready for its package (a miss) makes the pool keep one more such
// family for prestartHold, up to maxPreloadFamilies (~28 MiB each): a pattern of resumes that came too close
// together once finds enough families ready the next time.

// preloadable lists the packages a zygote may import ahead, with their fam_ prefix letter.
var preloadable = map[string]string{"numpy": "n"}

// prestartHold is how long a family started ahead waits for its first sandbox.
const prestartHold = 10 * time.Minute

// maxPreloadFamilies is the most families the pool keeps with one package imported ahead (preloadWanted).
const maxPreloadFamilies = 3

// preloadWanted is how many families with a package imported ahead the pool keeps, given when resumes (or
// creates) needing it last found none ready (misses): one, and one more per miss within prestartHold of now,
// at most maxPreloadFamilies.
func preloadWanted(misses []time.Time, now time.Time) int {
	n := 1
	for _, at := range misses {
		if now.Sub(at) < prestartHold {
			n++
		}
	}
	return min(n, maxPreloadFamilies)
}

// prestartRefillDelay is how long after a family started ahead is taken its replacement starts: soon, so that
// creates or resumes a few hundred milliseconds apart each find one (with 250 ms, half of creates 0.3 s apart
// started cold: p50 42-45 ms, max 140; with 50 ms, 22-24 ms, max 32-38). The sandbox that took it starts no
// process of its own (its interpreter is the zygote's fork), so the replacement's starts hardly slow it.
const prestartRefillDelay = 50 * time.Millisecond

type prestartPool struct {
	once sync.Once // starts the upkeep
	mu   sync.Mutex
	idle []prestarted
	// wantPreload: when a session needing each preloadable package was last saved or resumed
	// (PrepareResume, Spec.Preload); the pool keeps a family with it imported ahead for prestartHold after that.
	wantPreload map[string]time.Time
	// missedPreload: when a sandbox needing each preloadable package found no family ready with it imported
	// (the most recent maxPreloadFamilies of them; see preloadWanted).
	missedPreload map[string][]time.Time
	filling       bool
	closed        bool
	stop          chan struct{} // closed by Close: ends the pool's upkeep
}

type prestarted struct {
	f       *family
	zyg     *sandbox // the family's zygote; nil if it could not be made
	at      time.Time
	preload string // the package its zygote imported ahead ("": none)
}

// end kills a family started ahead that no sandbox took, and its zygote.
func (r *Runtime) endPrestarted(p prestarted) {
	p.f.kill()
	if p.zyg != nil {
		r.endZygote(p.zyg)
	}
}

// usable reports whether p may still be taken: younger than half its hold, its init running.
func (p prestarted) usable() bool {
	return time.Since(p.at) < prestartHold/2 && alive(p.f.initPid, p.f.initStart)
}

// startPrestartUpkeep fills the pool and keeps it fresh until Close. It starts after the reclaim scan of a
// server's start (which would take families started before it for a dead server's orphans), or at the first
// create if there is no such scan.
func (r *Runtime) startPrestartUpkeep() {
	if r.cfg.PrestartFamilies <= 0 {
		return
	}
	r.pre.once.Do(r.runPrestartUpkeep)
}

func (r *Runtime) runPrestartUpkeep() {
	r.pre.mu.Lock()
	defer r.pre.mu.Unlock()
	if r.pre.closed {
		return
	}
	r.pre.stop = make(chan struct{})
	r.bg.Add(1)
	go func() {
		defer r.bg.Done()
		t := time.NewTicker(prestartHold / 4)
		defer t.Stop()
		for {
			r.refreshPrestarted()
			r.fillPrestarted()
			select {
			case <-r.pre.stop:
				return
			case <-t.C:
			}
		}
	}()
}

// PrepareResume implements runtime.ResumePreparer: a session whose loading imports a preloadable package was
// saved, so the pool keeps a family with it imported ahead from now on (for prestartHold), and starts making it.
func (r *Runtime) PrepareResume(preload []string) {
	pkg := preloadPackage(preload)
	if r.cfg.PrestartFamilies <= 0 || pkg == "" {
		return
	}
	r.pre.mu.Lock()
	r.notePreload(pkg)
	r.pre.mu.Unlock()
	r.startPrestartUpkeep()
	r.bg.Add(1)
	go func() {
		defer r.bg.Done()
		r.fillPrestarted()
	}()
}

// notePreload records that a sandbox needs pkg imported ahead now. Called with r.pre.mu held.
func (r *Runtime) notePreload(pkg string) {
	if r.pre.wantPreload == nil {
		r.pre.wantPreload = map[string]time.Time{}
	}
	r.pre.wantPreload[pkg] = time.Now()
}

// notePreloadMiss records that a sandbox needing pkg found no family ready with it imported. Called with
// r.pre.mu held.
func (r *Runtime) notePreloadMiss(pkg string) {
	if r.pre.missedPreload == nil {
		r.pre.missedPreload = map[string][]time.Time{}
	}
	m := append(r.pre.missedPreload[pkg], time.Now())
	r.pre.missedPreload[pkg] = m[max(0, len(m)-maxPreloadFamilies):]
}

// preloadPackage returns the one package of preload if a zygote may import it ahead ("": none).
func preloadPackage(preload []string) string {
	if len(preload) != 1 || preloadable[preload[0]] == "" {
		return ""
	}
	return preload[0]
}

// preloadFor returns the package a family started ahead could have imported for spec ("": none): the one
// package spec's session needs, if preloadable, for a 1-vCPU sandbox on the default image.
func preloadFor(spec runtime.Spec) string {
	if spec.Image != "" || startRequest(spec).CPUs != 1 {
		return ""
	}
	return preloadPackage(spec.Preload)
}

// takePrestarted returns a family started ahead for spec whose init still runs, with its zygote if it has one
// (nil if there is none), and has the pool refilled in the background. A family whose zygote imported the
// package spec's session needs is taken first, else a plain one; a spec that needs none gets a plain one.
func (r *Runtime) takePrestarted(spec runtime.Spec) (*family, *sandbox) {
	if r.cfg.PrestartFamilies <= 0 {
		return nil, nil
	}
	want := preloadFor(spec)
	var got *prestarted
	var stale []prestarted
	r.pre.mu.Lock()
	if pkg := preloadPackage(spec.Preload); pkg != "" {
		r.notePreload(pkg)
	}
	for _, kind := range []string{want, ""} {
		kept := r.pre.idle[:0]
		for _, p := range r.pre.idle {
			switch {
			case !p.usable():
				stale = append(stale, p)
			case got == nil && p.preload == kind:
				got = &p
			default:
				kept = append(kept, p)
			}
		}
		r.pre.idle = kept
		if got != nil || want == "" {
			break
		}
	}
	if want != "" && (got == nil || got.preload != want) {
		r.notePreloadMiss(want)
	}
	r.pre.mu.Unlock()
	for _, p := range stale {
		r.endPrestarted(p)
	}
	r.startPrestartUpkeep()
	r.bg.Add(1)
	go func() {
		defer r.bg.Done()
		select {
		case <-time.After(prestartRefillDelay):
		case <-r.pre.stop:
		}
		r.fillPrestarted()
	}()
	if got == nil {
		return nil, nil
	}
	return got.f, got.zyg
}

// refreshPrestarted ends the idle families older than half their hold (fillPrestarted replaces them).
func (r *Runtime) refreshPrestarted() {
	var old []prestarted
	r.pre.mu.Lock()
	kept := r.pre.idle[:0]
	for _, p := range r.pre.idle {
		if p.usable() {
			kept = append(kept, p)
		} else {
			old = append(old, p)
		}
	}
	r.pre.idle = kept
	r.pre.mu.Unlock()
	for _, p := range old {
		r.endPrestarted(p)
	}
}

// missingPrestarted returns the kind of family the pool lacks ("" plain, else the package its zygote imports
// ahead) and whether it lacks one. Called with r.pre.mu held.
func (r *Runtime) missingPrestarted() (string, bool) {
	if r.pre.closed {
		return "", false
	}
	count := map[string]int{}
	for _, p := range r.pre.idle {
		count[p.preload]++
	}
	if count[""] < r.cfg.PrestartFamilies {
		return "", true
	}
	for pkg, at := range r.pre.wantPreload {
		if time.Since(at) < prestartHold && count[pkg] < preloadWanted(r.pre.missedPreload[pkg], time.Now()) {
			return pkg, true
		}
	}
	return "", false
}

// fillPrestarted starts families until the pool holds Config.PrestartFamilies plain ones, and for each package
// asked for lately as many with it imported ahead as preloadWanted says (one filler at a time).
func (r *Runtime) fillPrestarted() {
	r.pre.mu.Lock()
	if r.pre.filling || r.pre.closed {
		r.pre.mu.Unlock()
		return
	}
	r.pre.filling = true
	r.pre.mu.Unlock()
	defer func() {
		r.pre.mu.Lock()
		r.pre.filling = false
		r.pre.mu.Unlock()
	}()
	for {
		r.pre.mu.Lock()
		kind, need := r.missingPrestarted()
		r.pre.mu.Unlock()
		if !need {
			return
		}
		p, err := r.prestartFamily(kind)
		if err != nil {
			r.log.Warn("start a family ahead of need", "err", err)
			return
		}
		r.pre.mu.Lock()
		if r.pre.closed {
			r.pre.mu.Unlock()
			r.endPrestarted(p)
			return
		}
		r.pre.idle = append(r.pre.idle, p)
		r.pre.mu.Unlock()
	}
}

// prestartFamily starts a family, held for prestartHold, with its zygote (which imports preload ahead, if
// set) and one spare agent.
func (r *Runtime) prestartFamily(preload string) (prestarted, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	letter := "p"
	if preload != "" {
		letter = preloadable[preload]
	}
	f, err := r.startFamily(ctx, "fam_"+letter+newToken()[:24])
	if err != nil {
		return prestarted{}, err
	}
	if _, err := f.call(ctx, initRequest{Op: "hold", HoldS: prestartHold.Seconds()}, nil); err != nil {
		f.kill()
		return prestarted{}, err
	}
	p := prestarted{f: f, preload: preload}
	if p.zyg, err = r.startZygote(ctx, f, preload); err != nil {
		// The family still saves a create its process starts; its interpreter starts as usual.
		r.log.Warn("start a zygote", "family", f.id, "err", err)
	}
	rep, err := f.call(ctx, initRequest{Op: "spares", Count: 1}, nil)
	if err != nil {
		r.endPrestarted(p)
		return prestarted{}, err
	}
	r.placeSpares(f, rep.Spares, spareLimits, true)
	p.at = time.Now()
	return p, nil
}

// closePrestarted stops the upkeep and ends the idle families (they hold no sandbox).
func (r *Runtime) closePrestarted() {
	r.pre.mu.Lock()
	if r.pre.closed {
		r.pre.mu.Unlock()
		return
	}
	r.pre.closed = true
	if r.pre.stop != nil {
		close(r.pre.stop)
	}
	idle := r.pre.idle
	r.pre.idle = nil
	r.pre.mu.Unlock()
	for _, p := range idle {
		r.endPrestarted(p)
	}
}
