package sandbox

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"

	"github.com/ramify-dev/ramify/internal/runtime"
)

// syncBuffer is a log destination safe for concurrent writers.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

// take returns what was logged since the last take.
func (s *syncBuffer) take() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := s.b.String()
	s.b.Reset()
	return out
}

// TestRestartReclaimsWhatNoRecordOwns: a server that dies mid-pause (session stored, sandbox frozen), mid-fork
// (children made, no records) and mid-fork of a paused sandbox (snapshot copies, no records) leaves runtime
// sandboxes, layers and snapshots no record owns. The next start removes exactly those, logs what it removed,
// thaws the sandbox whose pause it cut short, keeps what records own (running sandboxes, a lost sandbox's
// files, a paused sandbox's snapshot), touches snapshots of unknown ids only in a store that is its own, and a
// further start finds nothing.
func TestRestartReclaimsWhatNoRecordOwns(t *testing.T) {
	logs := &syncBuffer{}
	e := newEnv(t, func(c *Config) { c.Logger = slog.New(slog.NewTextHandler(logs, nil)) })
	ctx := context.Background()
	running, pausing, paused, lost := e.create(), e.create(), e.create(), e.create()
	e.run(pausing, "x = kept")
	if _, _, err := e.svc.Pause(ctx, paused); err != nil {
		t.Fatal(err)
	}
	e.waitFor(paused, StatusPaused)
	pausedKeys := e.snaps.Keys()

	// A pause that dies half-way: the session is stored and the sandbox frozen when the server "crashes" (this
	// service never gets further: it is abandoned, as a killed process would be).
	reached := make(chan struct{})
	var once sync.Once
	e.snaps.SetFault(func(ctx context.Context, method, key string) error {
		if method == "Put" && strings.HasSuffix(key, "/layer.tar") && strings.HasPrefix(key, pausing+"/") {
			once.Do(func() { close(reached) })
			<-ctx.Done()
			return ctx.Err()
		}
		return nil
	})
	if _, _, err := e.svc.Pause(ctx, pausing); err != nil {
		t.Fatal(err)
	}
	<-reached
	if !e.rt.Frozen(pausing) {
		t.Fatal("the pause did not freeze the sandbox before writing its layer")
	}
	e.rt.Kill(lost)
	// A fork cut short after its children were made: runtime sandboxes and a staging layer, no records.
	layers := filepath.Dir(e.rt.UpperDir(e.rt.Get(running).Handle()))
	var orphans []string
	for range 2 {
		h, err := e.rt.Create(ctx, runtime.Spec{ID: NewID()})
		if err != nil {
			t.Fatal(err)
		}
		orphans = append(orphans, h.ID)
	}
	if err := os.MkdirAll(filepath.Join(layers, "fork-0123456789abcdef"), 0o755); err != nil {
		t.Fatal(err)
	}
	// A fork of a paused sandbox cut short after copying its snapshot: objects of an id no record has.
	unknown := NewID() + "/1/manifest.json"
	if _, err := e.snaps.Put(ctx, unknown, strings.NewReader("{}")); err != nil {
		t.Fatal(err)
	}
	abandoned := e.svc
	e.snaps.SetFault(nil)
	logs.take()

	// Restart on a store shared with other servers: snapshots of unknown ids are not this server's to delete.
	e.start()
	t.Cleanup(abandoned.Close) // after the new service is closed (cleanups run last first)
	got := logs.take()
	for _, want := range []string{"kind=processes count=2", "kind=layers count=3", "kind=snapshots count=1"} {
		if !strings.Contains(got, want) {
			t.Errorf("the restart's log lacks %q:\n%s", want, got)
		}
	}
	ids := e.rt.IDs()
	sort.Strings(ids)
	if want := sorted(running, pausing); !slices.Equal(ids, want) {
		t.Errorf("the runtime holds %v after the restart, want %v (orphans %v)", ids, want, orphans)
	}
	wantLayers := sorted(e.rt.Get(running).Layer, e.rt.Get(pausing).Layer, layerOf(t, e, lost))
	if got := e.rt.Layers(); !slices.Equal(got, wantLayers) {
		t.Errorf("layers %v after the restart, want %v", got, wantLayers)
	}
	if got, want := e.snaps.Keys(), sorted(append(slices.Clone(pausedKeys), unknown)...); !slices.Equal(got, want) {
		t.Errorf("snapshot objects %v after the restart, want %v", got, want)
	}
	if e.rt.Frozen(pausing) || e.status(pausing) != StatusRunning || e.run(pausing, "x") != "kept" {
		t.Errorf("the sandbox whose pause was cut short is not running, thawed, with its state")
	}
	if e.status(lost) != StatusError || e.status(paused) != StatusPaused {
		t.Errorf("lost is %s, paused is %s", e.status(lost), e.status(paused))
	}

	// The data directory's own store: the unknown id's snapshot goes too; nothing else is left to reclaim.
	e.svc.Close()
	e.cfg.SnapshotsExclusive = true
	e.start()
	if got := logs.take(); strings.Count(got, "reclaimed leftovers") != 1 || !strings.Contains(got, "kind=snapshots count=1") {
		t.Errorf("second restart's log, want only the unknown id's snapshot reclaimed:\n%s", got)
	}
	if got := e.snaps.Keys(); !slices.Equal(got, pausedKeys) {
		t.Errorf("snapshot objects %v, want %v", got, pausedKeys)
	}
	e.svc.Close()
	e.start()
	if got := logs.take(); strings.Contains(got, "reclaimed leftovers") {
		t.Errorf("a third start reclaimed again:\n%s", got)
	}
	// What records own still works: the lost sandbox is deleted with its files, the paused one resumes.
	if err := e.svc.Delete(ctx, lost); err != nil {
		t.Fatal(err)
	}
	if _, _, err := e.svc.Resume(ctx, paused); err != nil {
		t.Fatal(err)
	}
	e.waitFor(paused, StatusRunning)
	if got := e.rt.Layers(); len(got) != 3 {
		t.Errorf("layers %v, want those of the three running sandboxes", got)
	}
}

func sorted(s ...string) []string {
	s = slices.Clone(s)
	sort.Strings(s)
	return s
}

// layerOf is the layer a sandbox's record names.
func layerOf(t *testing.T, e *env, id string) string {
	t.Helper()
	e.svc.mu.Lock()
	defer e.svc.mu.Unlock()
	en := e.svc.items[id]
	if en == nil {
		t.Fatalf("no entry for %s", id)
	}
	return en.handle.Layer()
}

// TestRestartFinishesAMergeCutShort: a merge records its outcome before the runtime swaps; a server killed in
// between restarts with the merge done (the parent's id runs the winner's interpreter, the winner's id is gone)
// and reclaims the parent's old sandbox.
func TestRestartFinishesAMergeCutShort(t *testing.T) {
	e := newEnv(t, nil)
	ctx := context.Background()
	parent := e.create()
	e.run(parent, "x = parent")
	fr, err := e.svc.Fork(ctx, parent, 1)
	if err != nil {
		t.Fatal(err)
	}
	winner := fr.Children[0]
	e.run(winner, "x = winner")
	winnerLayer := e.rt.Get(winner).Layer
	reached, release := make(chan struct{}), make(chan struct{})
	e.rt.SetFault(func(ctx context.Context, method, id string) error {
		if method == "Swap" {
			close(reached)
			<-release
			return fmt.Errorf("the server was killed")
		}
		return nil
	})
	abandoned := e.svc
	done := make(chan error, 1)
	go func() { done <- abandoned.MergeInto(ctx, parent, winner) }()
	<-reached
	e.rt.SetFault(nil)
	e.start()
	t.Cleanup(func() { close(release); <-done; abandoned.Close() })

	if got := e.status(parent); got != StatusRunning {
		t.Fatalf("parent is %s after the restart", got)
	}
	if got := e.run(parent, "x"); got != "winner" {
		t.Errorf("parent's x = %q after the restart, want the winner's", got)
	}
	if _, err := e.svc.Get(ctx, winner); err == nil {
		t.Errorf("the winner's id still answers after the merge was finished")
	}
	if got := e.rt.IDs(); !slices.Equal(got, []string{parent}) {
		t.Errorf("the runtime holds %v, want only %s", got, parent)
	}
	if got := e.rt.Layers(); !slices.Equal(got, []string{winnerLayer}) {
		t.Errorf("layers %v, want only the winner's %s", got, winnerLayer)
	}
}

// TestMergeWhoseSwapFailsKeepsBoth: the merge's records are written before the swap; a swap that fails puts
// both back, in memory, in the store (a restart sees both) and in the retired ids (the winner's id is not
// reported as merged).
func TestMergeWhoseSwapFailsKeepsBoth(t *testing.T) {
	e := newEnv(t, nil)
	ctx := context.Background()
	parent := e.create()
	fr, err := e.svc.Fork(ctx, parent, 1)
	if err != nil {
		t.Fatal(err)
	}
	winner := fr.Children[0]
	e.rt.SetFault(func(ctx context.Context, method, id string) error {
		if method == "Swap" {
			return fmt.Errorf("swap refused")
		}
		return nil
	})
	if err := e.svc.MergeInto(ctx, parent, winner); err == nil {
		t.Fatal("merge succeeded although the swap failed")
	}
	e.rt.SetFault(nil)
	e.svc.Close()
	e.start()
	for _, id := range []string{parent, winner} {
		if got := e.status(id); got != StatusRunning {
			t.Errorf("%s is %s after a failed merge and a restart", id, got)
		}
	}
	if err := e.svc.MergeInto(ctx, parent, winner); err != nil {
		t.Fatalf("merge again: %v", err)
	}
}

// TestRestartRestartsASandboxWhoseSaveKeptMemory: a save copy's cgroup that a server killed mid-save left still
// holding memory (the runtime's reclaim reports it kept: memory the sandbox's processes hold outside its limit)
// has the next start restart that sandbox's processes, which says so in its next run_code; another running
// sandbox is untouched, and a further start finds nothing to do.
func TestRestartRestartsASandboxWhoseSaveKeptMemory(t *testing.T) {
	e := newEnv(t, nil)
	ctx := context.Background()
	kept, other := e.create(), e.create()
	e.run(kept, "x = one")
	e.run(other, "x = two")
	e.rt.LeaveSaveKept(kept, 400<<20)
	e.svc.Close()
	e.start()
	if e.status(kept) != StatusRunning || e.status(other) != StatusRunning {
		t.Fatalf("after the restart: %s %s, want both running", e.status(kept), e.status(other))
	}
	ex, err := e.svc.RunCode(ctx, kept, RunCodeRequest{Code: "x"}, nil)
	if err != nil || ex.Error == nil || !strings.Contains(ex.Error.Value, "400.0 MiB written by the session's own code as it was saved") {
		t.Fatalf("the first run after the restart: %+v %v, want it to say the processes were restarted", ex, err)
	}
	if ex, err := e.svc.RunCode(ctx, kept, RunCodeRequest{Code: "x"}, nil); err != nil || ex.Error == nil {
		t.Errorf("the restarted sandbox kept its interpreter's state: %+v %v", ex, err)
	}
	if got := e.run(other, "x"); got != "two" {
		t.Errorf("the other sandbox after the restart: x = %q", got)
	}
	e.svc.Close()
	e.start()
	e.run(kept, "y = three")
	if got := e.run(kept, "y"); got != "three" {
		t.Errorf("after a further start: y = %q", got)
	}
}
