package namespaces

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/ramify-dev/ramify/internal/agent"
	"github.com/ramify-dev/ramify/internal/runtime"
)

// A zygote is a fresh interpreter that a family started ahead keeps ready, in a hidden sandbox of its own on the
// default image (an empty layer, no network, small limits). A sandbox created in that family (a cold create, a
// resume) gets it instead of an interpreter started from nothing: Python's start, its site set-up, the
// interpreter loop's imports and compilation and its seccomp set-up, ~45-60 ms in a sandbox here, become the
// zygote's move into the new sandbox, done as a fork child does it but by the zygote itself, unforked
// (forkInterpreter's handover): a zygote serves one sandbox and ran nobody's code, so the fork of it that an
// earlier version made (~20-30 ms for one with numpy imported, on a VM here) kept nothing from it that it does
// not keep itself. The interpreter is then given the sandbox's env and cwd, as a fresh one is
// (agent.StartRequest.Fresh), and what is left of the zygote (its agent, cgroup and layer) is removed: no two
// sandboxes share anything it held (its hash seed, its random state).

// zygoteLimits are a zygote sandbox's cgroup limits: it only starts Python.
const (
	zygoteMemMiB   = 256
	zygoteMaxProcs = 16
)

// startZygote makes family f's zygote: a layer, an agent (the family's spare, or a new one) and its interpreter,
// which imports package preload ahead if it is set, with a 1-vCPU sandbox's thread counts.
func (r *Runtime) startZygote(ctx context.Context, f *family, preload string) (_ *sandbox, err error) {
	id := "zyg_" + strings.TrimPrefix(f.id, "fam_")
	dir, err := r.cfg.Layers.Create(ctx, id)
	if err != nil {
		return nil, fmt.Errorf("zygote layer: %w", err)
	}
	defer func() {
		if err != nil {
			r.cfg.Layers.Remove(context.Background(), id) //nolint:errcheck // undo
		}
	}()
	if err := prepareLayer(dir); err != nil {
		return nil, fmt.Errorf("zygote layer: %w", err)
	}
	spec := runtime.Spec{ID: id, VCPU: 1, MemMiB: zygoteMemMiB, MaxProcs: zygoteMaxProcs}
	sb, err := r.spawn(ctx, f, spec, dir, "")
	if err != nil {
		return nil, fmt.Errorf("zygote agent: %w", err)
	}
	var start agent.StartRequest
	if preload != "" {
		start.CPUs = 1
	}
	if err := sb.client.Start(ctx, start); err != nil {
		r.teardown(sb)
		return nil, fmt.Errorf("zygote interpreter: %w", err)
	}
	if preload != "" {
		if err := sb.client.Preload(ctx, []string{preload}); err != nil {
			r.teardown(sb)
			return nil, fmt.Errorf("zygote interpreter: import %s: %w", preload, err)
		}
	}
	return sb, nil
}

// endZygote removes a zygote: its processes, cgroup and layer.
func (r *Runtime) endZygote(z *sandbox) {
	r.teardown(z)
	if err := r.cfg.Layers.Remove(context.Background(), z.h.ID); err != nil {
		r.log.Warn("remove zygote layer", "zygote", z.h.ID, "err", err)
	}
}

// launchFromZygote is launch with the interpreter of zygote z (both in family f): spec's agent is spawned on
// layer dir to wait for a forked interpreter, z's interpreter hands itself over into the new sandbox, and gets
// spec's env and cwd. On error it undoes the spawn (the zygote's interpreter, if it was moved, is killed with
// the sandbox). The caller ends what is left of z (bgEnd) once the sandbox's agent, or the one of a fresh start
// after a failure, is in the family.
func (r *Runtime) launchFromZygote(ctx context.Context, f *family, z *sandbox, spec runtime.Spec, dir string, phase func(string)) (_ *sandbox, err error) {
	var undo cleanup
	defer func() {
		if err != nil {
			undo.run()
		}
	}()
	c := &forkChild{spec: spec, token: newToken()}
	if c.sb, err = r.spawn(ctx, f, spec, dir, c.token); err != nil {
		return nil, err
	}
	undo.add(func() { r.teardown(c.sb) })
	phase("spawned")
	kids := []*forkChild{c}
	pids, moved, err := r.forkInterpreter(ctx, z.client, kids, true)
	defer closeFiles(moved)
	if err != nil {
		return nil, err
	}
	phase("zygote handed over")
	err = r.moveForked(z, kids, pids, moved, &undo)
	if c.copyPidfd != nil {
		c.copyPidfd.Close() // its start below is answered synchronously: nothing to watch
	}
	if err != nil {
		return nil, err
	}
	phase("interpreter moved")
	req := startRequest(spec)
	req.Fresh = true
	if err := c.sb.client.Start(ctx, req); err != nil {
		return nil, fmt.Errorf("start sandbox: %w", err)
	}
	r.addMember(f, c.sb)
	return c.sb, nil
}

// zygoteEndDelay is how long bgEnd waits before it ends a zygote (tests set it to 0).
var zygoteEndDelay = 10 * time.Millisecond

// bgEnd ends zygote z in the background, after the sandbox forked from it has its answer.
func (r *Runtime) bgEnd(z *sandbox) {
	r.bg.Add(1)
	go func() {
		defer r.bg.Done()
		time.Sleep(zygoteEndDelay)
		r.endZygote(z)
	}()
}
