package sandbox

import (
	"context"
	"strings"

	"github.com/ramify-dev/ramify/internal/runtime"
)

// Start-up reclaim. A server killed half-way through a create, fork, pause, resume or merge leaves resources
// that no record owns: the children's or new sandbox's processes, cgroups, veths and layers, a fork's staging
// snapshot, a partial snapshot. Rather than intents for each phase of each operation, New scans, once the
// records are reconciled, for everything of this server's (named per data directory) that no record accounts
// for and removes it: it holds for any crash point, including ones no intent was written for, and running it
// again finds nothing.

// owned is what the records account for, after recovery: running sandboxes own their processes, cgroup, veth
// and layer; sandboxes in error keep their files (unless their state is a snapshot: an interrupted resume's
// layer is half-made); paused ones own only their snapshot. The caller holds s.mu or owns s alone (New).
func (s *Service) owned() runtime.Owned {
	var o runtime.Owned
	for _, e := range s.items {
		switch Status(e.rec.Status) {
		case StatusRunning:
			o.Running = append(o.Running, e.handle)
		case StatusError:
			if e.rec.Snapshot != "" {
				continue
			}
			if e.handle.ID != "" {
				o.Layers = append(o.Layers, e.handle.Layer())
			} else {
				o.Layers = append(o.Layers, e.rec.ID)
			}
		}
	}
	return o
}

// reclaim removes what no record owns (see above) and logs one line per kind it found. Best effort: a failure is
// logged, and the next start tries again.
func (s *Service) reclaim(ctx context.Context) {
	if rc, ok := s.cfg.Runtime.(runtime.Reclaimer); ok {
		got, err := rc.Reclaim(ctx, s.owned())
		if err != nil {
			s.log.Warn("reclaim leftovers of interrupted work", "err", err)
		}
		s.logReclaimed("processes", got.Processes)
		s.logReclaimed("cgroups", got.Cgroups)
		s.logReclaimed("veths", got.Veths)
		s.logReclaimed("layers", got.Layers)
		// A save cut short by the restart whose copy wrote into memory the sandbox keeps: as after a save that
		// ended (restartKeptSave), that memory goes only with the sandbox's processes.
		for id, kept := range got.KeptSaves {
			e := s.items[id]
			if e == nil || Status(e.rec.Status) != StatusRunning {
				continue
			}
			ke := &saveKeptError{kept: kept}
			if pi := s.pauseInfo(e); pi.Error == pauseInterruptedByRestart { // a pause's, not a capture's
				pi.Error += "; " + ke.Error()
				s.setPauseInfo(e, pi)
			}
			s.restartKeptSave(e, e.handle, ke)
		}
	}
	if s.cfg.Snapshots == nil {
		return
	}
	s.logReclaimed("snapshots", s.reclaimSnapshots(ctx))
	s.logReclaimed("template snapshots", s.reclaimTemplates(ctx))
	if t, ok := s.cfg.Snapshots.(interface{ RemoveTemps() (int, error) }); ok && s.cfg.SnapshotsExclusive {
		n, err := t.RemoveTemps()
		if err != nil {
			s.log.Warn("reclaim snapshot temporary files", "err", err)
		}
		s.logReclaimed("snapshot temporary files", n)
	}
}

func (s *Service) logReclaimed(kind string, n int) {
	if n > 0 {
		s.log.Info("reclaimed leftovers of interrupted work", "kind", kind, "count", n)
	}
}

// reclaimSnapshots deletes the snapshots (key prefixes "<sandbox id>/<time>/") that no record names: those of
// this server's sandboxes (the id is one of its records, or one it retired: ids are random, no other server has
// them; a deleted paused sandbox's snapshot goes after its record, see dropSnapshot), and, when
// the store is this server's alone (Config.SnapshotsExclusive), those of ids no record has (a fork of a paused
// sandbox cut short before its children's records). It returns how many snapshots it deleted.
func (s *Service) reclaimSnapshots(ctx context.Context) int {
	objs, err := s.cfg.Snapshots.List(ctx, "")
	if err != nil {
		s.log.Warn("reclaim snapshots: list", "err", err)
		return 0
	}
	keep, ids := map[string]bool{}, map[string]bool{}
	for id := range s.retired {
		ids[id] = true
	}
	for _, e := range s.items {
		ids[e.rec.ID] = true
		if e.rec.Snapshot != "" {
			keep[e.rec.Snapshot] = true
		}
	}
	doomed := map[string]bool{}
	for _, o := range objs {
		parts := strings.SplitN(o.Key, "/", 3)
		if len(parts) < 3 || !strings.HasPrefix(parts[0], "sbx_") {
			continue // not a sandbox snapshot's object
		}
		prefix := parts[0] + "/" + parts[1] + "/"
		if !keep[prefix] && (ids[parts[0]] || s.cfg.SnapshotsExclusive) {
			doomed[prefix] = true
		}
	}
	n := 0
	for prefix := range doomed {
		if err := s.cfg.Snapshots.Delete(ctx, prefix); err != nil {
			s.log.Warn("reclaim snapshot", "prefix", prefix, "err", err)
			continue
		}
		n++
	}
	return n
}
