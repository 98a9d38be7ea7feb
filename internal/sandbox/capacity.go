package sandbox

import (
	"bufio"
	"fmt"
	"os"
	goruntime "runtime"
	"strconv"
	"strings"

	"github.com/ramify-dev/ramify/internal/errdefs"
)

// Capacity. A sandbox may not ask for more than the host has (400), and the server keeps the total of what live
// sandboxes may use under a multiple of the host (503 past it, as the reference answers when it is out of
// capacity): memory and CPU limits are ceilings, not reservations (fork children share their parent's memory
// until they write), so the totals may exceed the host by the overcommit factors, and no further.
const (
	DefaultMemOvercommit = 4.0  // total mem_mib of live sandboxes <= 4 x the host's memory
	DefaultCPUOvercommit = 32.0 // total vcpu of live sandboxes <= 32 x the host's CPUs (CPU limits are quotas of shared time)
)

// hostShape is what this host has.
type hostShape struct {
	cpus   int
	memMiB int
	pidMax int
}

func detectHost() hostShape {
	h := hostShape{cpus: goruntime.NumCPU(), pidMax: 4194304}
	if f, err := os.Open("/proc/meminfo"); err == nil {
		sc := bufio.NewScanner(f)
		for sc.Scan() {
			if v, ok := strings.CutPrefix(sc.Text(), "MemTotal:"); ok {
				kb, _ := strconv.Atoi(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")))
				h.memMiB = kb / 1024
			}
		}
		f.Close()
	}
	if b, err := os.ReadFile("/proc/sys/kernel/pid_max"); err == nil {
		if n, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil {
			h.pidMax = n
		}
	}
	return h
}

// fitsHost refuses a shape larger than the host.
func (s *Service) fitsHost(spec CreateRequest) error {
	h := s.host
	switch {
	case h.cpus > 0 && spec.VCPU > float64(h.cpus):
		return invalid("vcpu %g is more than this host's %d CPUs", spec.VCPU, h.cpus)
	case h.memMiB > 0 && spec.MemMiB > h.memMiB:
		return invalid("mem_mib %d is more than this host's %d MiB of memory", spec.MemMiB, h.memMiB)
	case spec.MaxProcs > h.pidMax:
		return invalid("max_procs %d is more than this host's pid_max %d", spec.MaxProcs, h.pidMax)
	}
	return nil
}

// admitLocked refuses n more sandboxes of spec's shape when the live sandboxes' totals would pass the overcommit
// limits. The caller holds s.mu and, to make the admission stick, records the new entries before releasing it.
func (s *Service) admitLocked(spec CreateRequest, n int) error {
	if s.host.memMiB <= 0 || s.host.cpus <= 0 {
		return nil
	}
	memLimit := float64(s.host.memMiB) * s.cfg.MemOvercommit
	cpuLimit := float64(s.host.cpus) * s.cfg.CPUOvercommit
	var mem, cpu float64
	for _, e := range s.items {
		if e.gone || e.pooled {
			continue
		}
		switch Status(e.rec.Status) {
		case StatusCreating, StatusRunning, StatusPausing, StatusResuming:
			mem += float64(e.spec.MemMiB)
			cpu += e.spec.VCPU
		}
	}
	mem += float64(spec.MemMiB * n)
	cpu += spec.VCPU * float64(n)
	switch {
	case mem > memLimit:
		return errdefs.New(errdefs.ErrUnavailable, fmt.Sprintf(
			"out of capacity: live sandboxes would have %.0f MiB of memory limits, more than %.0f MiB (%g x this host's memory, --mem-overcommit); delete or pause sandboxes, or retry later",
			mem, memLimit, s.cfg.MemOvercommit))
	case cpu > cpuLimit:
		return errdefs.New(errdefs.ErrUnavailable, fmt.Sprintf(
			"out of capacity: live sandboxes would have %g vCPUs, more than %g (%g x this host's CPUs, --cpu-overcommit); delete or pause sandboxes, or retry later",
			cpu, cpuLimit, s.cfg.CPUOvercommit))
	}
	return nil
}
