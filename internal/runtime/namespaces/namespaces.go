// Package namespaces is ramify's Linux-namespaces sandbox runtime. A family of sandboxes (a sandbox and
// everything forked from it) shares one user namespace (container root = host uid 100000) and one PID namespace
// whose init (init.go) only reaps and spawns agents. Each sandbox has its own mount, network, UTS and IPC
// namespaces, held by its agent process, its own cgroup, a veth on the host bridge, and a root file system that
// is an overlay of the shared read-only image and the sandbox's own writable layer.
package namespaces

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	goruntime "runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ramify-dev/ramify/internal/agent"
	"github.com/ramify-dev/ramify/internal/cgroups"
	"github.com/ramify-dev/ramify/internal/crashpoint"
	"github.com/ramify-dev/ramify/internal/errdefs"
	"github.com/ramify-dev/ramify/internal/layer"
	"github.com/ramify-dev/ramify/internal/network"
	"github.com/ramify-dev/ramify/internal/runtime"
	"github.com/ramify-dev/ramify/internal/seccomp"
)

// HostUID and HostGID are the host ids that container root maps to.
const (
	HostUID = 100000
	HostGID = 100000
	idRange = 65536
)

// Config configures the runtime.
type Config struct {
	DataDir string // the server's data directory (logs go to DataDir/logs)
	// Binary is the statically linked ramify executable run as family init and agent; when empty, Guest is,
	// and when that is nil too, this process's own executable (/proc/self/exe). It must be static: the family
	// init runs it from an empty root file system.
	Binary string
	// Guest is the in-sandbox program (internal/guest: `__init` and `__agent` only), as make build embeds it
	// in the ramify binary.
	Guest       []byte
	ImageRootfs string // the default image: the read-only lower layer of sandboxes without an image of their own
	// Images returns the overlay lower dirs of a named image, top first (image.Lowers); nil: only the default
	// image exists.
	Images  func(name string) ([]string, error)
	Layers  layer.Driver
	Cgroups cgroups.Manager
	Network *network.Manager
	Logger  *slog.Logger
	// SpareAgents is how many spare agents a family keeps ready after a fork (up to the number of children
	// that fork made), so that its next fork hands children to running agents instead of starting processes.
	// 0 turns spares off.
	SpareAgents int
	// SpareIdle is how long an unused spare agent lives (0: until its family ends).
	SpareIdle time.Duration
	// InterpreterStall bounds a fork's wait for the parent's interpreter to fork (0:
	// runtime.DefaultInterpreterStall): code in the sandbox can keep it from ever answering.
	InterpreterStall time.Duration
	// SpareAhead is how many spare agents families may hold ahead of their first fork, in all (PrepareFork);
	// 0: none.
	SpareAhead int
	// PrestartFamilies is how many families the runtime keeps started ahead of need, each with a spare agent,
	// for creates without a fork parent (see prestart.go); 0: none.
	PrestartFamilies int
	// Owner names this server among others on the host (serve passes a digest of the data directory). Family
	// inits carry it in their command line, so that Reclaim kills only this server's orphans; "" turns the
	// process scan off.
	Owner string
}

// Runtime is the namespaces runtime.
type Runtime struct {
	cfg Config
	log *slog.Logger

	mu        sync.Mutex
	families  map[string]*family
	sandboxes map[string]*sandbox
	live      liveness // pidfds of the inits and agents, for Lost (guarded by mu)

	bg sync.WaitGroup // clean-up finishing in the background (after a merge)
	// retiring has, for each sandbox id whose resources (layer, cgroup, veth) a merge is removing in the
	// background, a channel closed once they are gone: a sandbox created under that id (the merged sandbox
	// resumed) waits for it, or the clean-up would remove the new sandbox's resources of the same names.
	retiring map[string]chan struct{}

	pre   prestartPool // families started ahead of need
	ahead aheadBudget  // families holding spares ahead of their first fork

	bin  *os.File // the ramify executable, sealed in a memfd (see sealedBinary)
	logs *logSink // where families' inits and agents write their diagnostics

	// polls counts Lost's calls (guarded by mu), portsGone the host veths the last look found missing, and
	// checking is set while a look runs (checkPorts).
	polls     int
	portsGone map[string]bool
	checking  atomic.Bool
}

type sandbox struct {
	h      runtime.Handle
	netFD  int
	client *agent.Client
	cg     cgroups.Cgroup
}

var _ runtime.Runtime = (*Runtime)(nil)

// New returns a runtime.
func New(cfg Config) (*Runtime, error) {
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	if err := os.MkdirAll(filepath.Join(cfg.DataDir, "logs"), 0o700); err != nil {
		return nil, err
	}
	bin, err := sealedBinary(cfg.Binary, cfg.Guest)
	if err != nil {
		return nil, err
	}
	logs, err := openLogSink(filepath.Join(cfg.DataDir, "logs", "sandboxes.log"))
	if err != nil {
		bin.Close()
		return nil, err
	}
	return &Runtime{cfg: cfg, log: cfg.Logger, families: map[string]*family{}, sandboxes: map[string]*sandbox{}, bin: bin, logs: logs}, nil
}

// gidRange is how many group ids a family maps: the ordinary 65536 and, above them, one sandbox group per
// possible agent pid (agent.SandboxGID: seccomp.SandboxGIDBase + the agent's pid in the family's PID namespace).
func gidRange() int {
	pidMax := 1 << 22 // PID_MAX_LIMIT on 64-bit
	if b, err := os.ReadFile("/proc/sys/kernel/pid_max"); err == nil {
		if n, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && n > 0 {
			pidMax = n
		}
	}
	return seccomp.SandboxGIDBase + pidMax
}

// cleanup is a rollback stack: functions run in reverse order unless Release is called.
type cleanup struct{ fns []func() }

func (c *cleanup) add(f func()) { c.fns = append(c.fns, f) }
func (c *cleanup) run() {
	for i := len(c.fns) - 1; i >= 0; i-- {
		c.fns[i]()
	}
	c.fns = nil
}
func (c *cleanup) release() { c.fns = nil }

// startFamily starts a family init in fresh user, PID, mount, network, UTS and IPC namespaces.
func (r *Runtime) startFamily(ctx context.Context, id string) (*family, error) {
	// The init's (and its agents') stdout and stderr are a pipe that the server copies into sandboxes.log: no
	// process of a family holds a descriptor of a host file.
	logw, err := r.logs.writer(id)
	if err != nil {
		return nil, err
	}
	defer logw.Close()
	cmd := exec.Command(execPath(r.bin), initArgs(r.cfg.Owner)...)
	cmd.Args[0] = "ramify"
	cmd.Stdout, cmd.Stderr = logw, logw
	cmd.Env = []string{"GOMAXPROCS=1", "GOGC=50"}
	cmd.Dir = "/"
	cmd.SysProcAttr = &syscall.SysProcAttr{
		Cloneflags: syscall.CLONE_NEWUSER | syscall.CLONE_NEWPID | syscall.CLONE_NEWNS | syscall.CLONE_NEWNET |
			syscall.CLONE_NEWUTS | syscall.CLONE_NEWIPC,
		UidMappings:                []syscall.SysProcIDMap{{ContainerID: 0, HostID: HostUID, Size: idRange}},
		GidMappings:                []syscall.SysProcIDMap{{ContainerID: 0, HostID: HostGID, Size: gidRange()}},
		GidMappingsEnableSetgroups: true,
		Credential:                 &syscall.Credential{Uid: 0, Gid: 0},
		Setsid:                     true,
	}
	if err := startOwnedBy(cmd, newOwnerUID()); err != nil {
		return nil, fmt.Errorf("start family init: %w", err)
	}
	go cmd.Wait() //nolint:errcheck // reaps the init when it exits
	pid := cmd.Process.Pid
	// The init, and the spare agents it starts, live in a cgroup of the family's own, not the server's.
	cg, err := r.cfg.Cgroups.Create(id, familyLimits)
	if err == nil {
		err = cg.Add(pid)
	}
	if err != nil {
		cmd.Process.Kill()
		if cg != nil {
			cg.Kill(ctx) //nolint:errcheck // best effort: the init is being killed anyway
			cg.Delete()  //nolint:errcheck
		}
		return nil, fmt.Errorf("family cgroup: %w", err)
	}
	start, err := procStart(pid)
	if err != nil {
		(&family{id: id, initPid: pid, cgroups: r.cfg.Cgroups}).kill()
		return nil, fmt.Errorf("family init exited at once (see %s/logs/sandboxes.log): %w", r.cfg.DataDir, err)
	}
	netFD, err := openNetNS(pid)
	if err != nil {
		(&family{id: id, initPid: pid, initStart: start, cgroups: r.cfg.Cgroups}).kill()
		return nil, err
	}
	f := &family{id: id, initPid: pid, initStart: start, netFD: netFD, members: map[string]bool{}, cmd: cmd, cgroups: r.cfg.Cgroups, network: r.cfg.Network}
	// Wait for its control socket.
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, err := f.call(ctx, initRequest{Op: "ping"}, nil); err == nil {
			break
		} else if time.Now().After(deadline) || ctx.Err() != nil || !alive(pid, start) {
			f.kill()
			return nil, fmt.Errorf("family init did not come up: %w", err)
		}
		time.Sleep(500 * time.Microsecond)
	}
	return f, nil
}

// familyLimits bound a family's own cgroup, which holds its init and the spare agents not yet claimed (a claimed
// agent moves to its sandbox's cgroup): tasks (processes and threads: the init and up to maxSpares spares, a few
// Go threads each), so that nothing the family's machinery does can fill the host's pid space. Memory and CPU
// are accounted there but not capped: a spare's start-up memory stays charged to it after its claim (cgroup v1
// does not move charges), and an out-of-memory kill of the init would end every sandbox of the family.
var familyLimits = cgroups.Limits{Pids: 1024}

// spareLimits bound the cgroup of a spare placed before its family forked (a family started ahead) until a claim
// renames it to a sandbox's and applies the sandbox's limits: a spare is one Go process with a few threads. A
// fork's spares are placed with its children's limits instead (refillSpares).
var spareLimits = cgroups.Limits{Pids: 64}

// kill ends the family: its init (and with it every process of its PID namespace) and the family's cgroup.
func (f *family) kill() {
	if f.initPid > 0 && (f.initStart == 0 || alive(f.initPid, f.initStart)) {
		syscall.Kill(f.initPid, syscall.SIGKILL)
	}
	f.pool.life.Lock() // placements and dials in flight finish first; none starts after
	f.pool.ended = true
	if f.netFD > 0 {
		unix.Close(f.netFD)
		f.netFD = -1
	}
	f.pool.life.Unlock()
	// Its spares' prepared ports would go with their namespaces, but the kernel frees a namespace in the
	// background: remove them now, so that nothing of the family is left once it has ended.
	f.pool.mu.Lock()
	var ports []string
	for _, sp := range f.pool.placed {
		if sp.port != "" {
			ports = append(ports, sp.port)
		}
	}
	f.pool.mu.Unlock()
	if f.network != nil {
		for _, port := range ports {
			f.network.Detach(port) //nolint:errcheck // gone already with its namespace: not an error
		}
	}
	if f.cgroups == nil || f.id == "" {
		return
	}
	names := []string{f.id}
	if all, err := f.cgroups.List(); err == nil {
		for _, n := range all {
			if strings.HasPrefix(n, spareCgroupPrefix(f.id)) {
				names = append(names, n) // its spares' (placeSpares)
			}
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for _, n := range names {
		if cg, err := f.cgroups.Load(n); err == nil {
			cg.Kill(ctx) //nolint:errcheck // what is left goes with the reclaim scan of the next start
			cg.Delete()  //nolint:errcheck
		}
	}
}

// mountOverlay creates, from the host side, a detached overlay mount of the image (lower) and layer dir's upper
// and work directories, and returns its mount fd. The agent attaches it in its own mount namespace: an overlay
// mounted by host root works whatever namespace it ends up in, where one mounted inside the user namespace
// could not reach layers outside its mount namespace.
//
// The directories are given to overlayfs as /proc/self/fd/<n> of descriptors opened here, not by their paths:
// overlayfs shows the strings it was given in the mount's options, which sandbox code reads in
// /proc/self/mountinfo, and the host's paths (its data and image directories, other sandboxes' layers) are
// not the sandbox's to know. (Any character is then fine in a path, ':' and ',' included.)
func (r *Runtime) mountOverlay(dir string, lowers []string) (int, error) {
	var fds []int
	defer func() {
		for _, fd := range fds {
			unix.Close(fd)
		}
	}()
	byFd := func(p string) (string, error) {
		fd, err := unix.Open(p, unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
		if err != nil {
			return "", fmt.Errorf("overlay: %w", &os.PathError{Op: "open", Path: p, Err: err})
		}
		fds = append(fds, fd)
		return fmt.Sprintf("/proc/self/fd/%d", fd), nil
	}
	var lowerFds []string
	for _, l := range lowers {
		p, err := byFd(l)
		if err != nil {
			return -1, err
		}
		lowerFds = append(lowerFds, p)
	}
	upper, err := byFd(filepath.Join(dir, "upper"))
	if err != nil {
		return -1, err
	}
	work, err := byFd(filepath.Join(dir, "work"))
	if err != nil {
		return -1, err
	}
	fsfd, err := unix.Fsopen("overlay", unix.FSOPEN_CLOEXEC)
	if err != nil {
		return -1, fmt.Errorf("fsopen overlay: %w", err)
	}
	defer unix.Close(fsfd)
	for _, kv := range [][2]string{
		{"lowerdir", strings.Join(lowerFds, ":")},
		{"upperdir", upper},
		{"workdir", work},
	} {
		if err := unix.FsconfigSetString(fsfd, kv[0], kv[1]); err != nil {
			return -1, fmt.Errorf("overlay %s=%s: %w", kv[0], kv[1], err)
		}
	}
	if err := unix.FsconfigCreate(fsfd); err != nil {
		return -1, fmt.Errorf("create overlay on %s: %w", dir, err)
	}
	mfd, err := unix.Fsmount(fsfd, unix.FSMOUNT_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("fsmount overlay: %w", err)
	}
	// overlayfs falls back to a read-only mount, with only a kernel log line, when it cannot make its work
	// directory (a layer at its disk quota): a sandbox whose root cannot be written, whose user cannot even
	// delete a file to make room. That is an error here, not a sandbox.
	var st unix.Statfs_t
	if err := unix.Fstatfs(mfd, &st); err != nil {
		unix.Close(mfd)
		return -1, fmt.Errorf("statfs overlay: %w", err)
	}
	if st.Flags&unix.ST_RDONLY != 0 {
		unix.Close(mfd)
		return -1, fmt.Errorf("overlay on %s %w", dir, errOverlayReadOnly)
	}
	return mfd, nil
}

// lowers returns the overlay lower dirs of image name ("": the default image), top first.
func (r *Runtime) lowers(name string) ([]string, error) {
	if name == "" {
		return []string{r.cfg.ImageRootfs}, nil
	}
	if r.cfg.Images == nil {
		return nil, errdefs.New(errdefs.ErrNotFound, fmt.Sprintf("image %q not found: this server has only the default image", name))
	}
	return r.cfg.Images(name)
}

// prepareLayer makes the upper and work directories of a fresh layer, owned by container root.
func prepareLayer(dir string) error {
	for _, d := range []string{"upper", "work"} {
		p := filepath.Join(dir, d)
		if err := os.MkdirAll(p, 0o755); err != nil {
			return err
		}
		if err := os.Lchown(p, HostUID, HostGID); err != nil {
			return err
		}
	}
	return nil
}

// limitsOf is the cgroup limits of a sandbox of spec s: its tasks limit is max_procs for the sandbox's code
// plus its agent's threads (agent.Tasks), so that neither can take the other's.
func limitsOf(s runtime.Spec) cgroups.Limits {
	return cgroups.Limits{CPUs: s.VCPU, MemoryBytes: int64(s.MemMiB) << 20, Pids: int64(s.MaxProcs) + agent.Tasks}
}

// startRequest is what a sandbox of spec's agent is started with: spec's environment and working directory, and
// the whole CPUs its quota gives (at least 1, at most the host's), to which numeric libraries' thread pools
// default (agent.ThreadEnv).
func startRequest(s runtime.Spec) agent.StartRequest {
	host := goruntime.NumCPU()
	cpus := int(s.VCPU)
	switch {
	case s.VCPU <= 0 || cpus > host:
		cpus = host
	case cpus < 1:
		cpus = 1
	}
	return agent.StartRequest{Env: s.Env, Cwd: s.Cwd, CPUs: cpus}
}

// spawn starts the agent of sandbox spec in family f, on layer dir, places it in its cgroup and network,
// and returns the new sandbox: on a placed spare if one is free, else on a new agent. On error everything it
// made is undone.
func (r *Runtime) spawn(ctx context.Context, f *family, spec runtime.Spec, dir, replToken string) (_ *sandbox, err error) {
	// Where the server places spares, it chooses them too: the init's own choice could be a spare that a fork
	// running beside this spawn has reserved (and forked an interpreter for).
	var reserved []placedSpare
	if _, ok := r.cfg.Cgroups.(cgroups.Renamer); ok {
		reserved = f.pool.reserve(1, reserveMaxAge(r.cfg.SpareIdle))
	}
	if reserved != nil {
		sb, err := r.seat(ctx, f, spec, reserved[0])
		if err != nil {
			return nil, err
		}
		if err := r.giveRoot(ctx, f, sb, spec, dir, replToken); err != nil {
			r.teardown(sb)
			return nil, err
		}
		return sb, nil
	}
	return r.spawnAgent(ctx, f, spec, dir, replToken)
}

// seat makes placed spare sp the agent of sandbox spec, as far as that needs no layer: its cgroup renamed to the
// sandbox's (with spec's limits) and its port named, addressed and raised. The init has not handed the spare its
// root and config yet (giveRoot), so a fork seats its children's spares while their layers are being cloned. On
// error the spare is killed (never to serve) and nothing of it is left.
func (r *Runtime) seat(ctx context.Context, f *family, spec runtime.Spec, sp placedSpare) (_ *sandbox, err error) {
	var undo cleanup
	defer func() {
		if err != nil {
			undo.run()
		}
	}()
	// The spare is known by its host pid, which the server looked up when it placed it: it must still be that
	// process (not a pid reused since) before its cgroup is renamed, and after its namespace is opened.
	same := func() error {
		if start, err := procStart(sp.hostPid); err != nil || start != sp.start {
			return fmt.Errorf("spare agent %d is gone", sp.nsPid)
		}
		return nil
	}
	if err := same(); err != nil {
		return nil, err
	}
	undo.add(func() { syscall.Kill(sp.hostPid, syscall.SIGKILL) })
	cg, err := r.sandboxCgroup(spec, sp, sp.hostPid)
	if err != nil {
		return nil, err
	}
	undo.add(func() { cg.Kill(context.Background()); cg.Delete() })
	netFD, err := openNetNS(sp.hostPid)
	if err == nil {
		if err = same(); err != nil {
			unix.Close(netFD)
		}
	}
	if err != nil {
		return nil, err
	}
	return r.connect(ctx, f, spec, netFD, sp.hostPid, sp.nsPid, sp.start, cg, sp.port)
}

// giveRoot has the family's init hand seated spare sb (seat) its root, the overlay of layer dir on the sandbox's
// image, and sandbox spec's config, then waits for the agent to answer.
func (r *Runtime) giveRoot(ctx context.Context, f *family, sb *sandbox, spec runtime.Spec, dir, replToken string) error {
	mfd, err := r.rootMount(sb.h.Image, dir)
	if err != nil {
		return err
	}
	req := initRequest{Op: "spawn", Pid: sb.h.AgentNsPid, Config: &agent.Config{Hostname: spec.Hostname, ReplToken: replToken}}
	_, err = f.call(ctx, req, []int{mfd})
	unix.Close(mfd)
	if err != nil {
		return fmt.Errorf("spawn agent: %w", err)
	}
	return r.waitAgent(ctx, sb)
}

// spawnAgent has the family's init start a new agent for sandbox spec (or, where the server does not place spares,
// give it an idle spare of the init's choice) on layer dir, then puts it in its cgroup and network.
func (r *Runtime) spawnAgent(ctx context.Context, f *family, spec runtime.Spec, dir, replToken string) (_ *sandbox, err error) {
	var undo cleanup
	defer func() {
		if err != nil {
			undo.run()
		}
	}()
	mfd, err := r.rootMount(spec.Image, dir)
	if err != nil {
		return nil, err
	}
	req := initRequest{Op: "spawn", Config: &agent.Config{Hostname: spec.Hostname, ReplToken: replToken}}
	if _, ok := r.cfg.Cgroups.(cgroups.Renamer); ok {
		req.Fresh = true // the server chooses spares here (spawn): none was free
	}
	rep, err := f.call(ctx, req, []int{mfd})
	unix.Close(mfd)
	if err != nil {
		return nil, fmt.Errorf("spawn agent: %w", err)
	}
	hostPid, err := hostPidOf(f.initPid, rep.Pid)
	if err != nil {
		return nil, fmt.Errorf("find agent: %w", err)
	}
	undo.add(func() { syscall.Kill(hostPid, syscall.SIGKILL) })
	cg, err := r.sandboxCgroup(spec, placedSpare{}, hostPid)
	if err != nil {
		return nil, err
	}
	undo.add(func() { cg.Kill(context.Background()); cg.Delete() })
	start, err := procStart(hostPid)
	if err != nil {
		return nil, fmt.Errorf("agent exited at once (see %s/logs/sandboxes.log): %w", r.cfg.DataDir, err)
	}
	netFD, err := openNetNS(hostPid)
	if err != nil {
		return nil, err
	}
	sb, err := r.connect(ctx, f, spec, netFD, hostPid, rep.Pid, start, cg, "")
	if err != nil {
		return nil, err
	}
	undo.add(func() { r.cfg.Network.Detach(vethOf(sb.h)); unix.Close(sb.netFD) })
	if err := r.waitAgent(ctx, sb); err != nil {
		return nil, err
	}
	return sb, nil
}

// rootMount mounts the overlay of layer dir on image's lower dirs and returns the mount's descriptor. A layer at
// its disk quota (a fork child's snapshot takes its parent's limit, and refers to as much as the parent) cannot
// take the work directory the mount makes: its limit is lifted and the mount tried again; the caller holds the
// layer to its quota once the root is mounted.
func (r *Runtime) rootMount(image, dir string) (int, error) {
	lowers, err := r.lowers(image)
	if err != nil {
		return -1, err
	}
	mfd, err := r.mountOverlay(dir, lowers)
	if errors.Is(err, errOverlayReadOnly) {
		if lerr := r.limitLayer(filepath.Base(dir), 0); lerr != nil {
			return -1, errors.Join(err, lerr)
		}
		mfd, err = r.mountOverlay(dir, lowers)
	}
	return mfd, err
}

// errOverlayReadOnly: overlayfs mounted the root read-only (it could not make its work directory).
var errOverlayReadOnly = errors.New("came up read-only (its work directory could not be made: is the layer at its disk quota?)")

// connect attaches the network namespace of sandbox spec's agent (host pid hostPid, nsPid in the family), open
// at netFD, to the bridge (on port prepared, if not ""), and returns the sandbox, whose agent may not listen yet
// (waitAgent). The sandbox owns netFD from then on; on error connect closes it, and nothing it made is left.
func (r *Runtime) connect(ctx context.Context, f *family, spec runtime.Spec, netFD, hostPid, nsPid int, start uint64, cg cgroups.Cgroup, prepared string) (*sandbox, error) {
	veth := network.VethName(spec.ID)
	if err := r.attach(ctx, spec, netFD, veth, prepared); err != nil {
		unix.Close(netFD)
		return nil, err
	}
	return &sandbox{
		h: runtime.Handle{ID: spec.ID, FamilyID: f.id, AgentPid: hostPid, AgentStart: start,
			InitPid: f.initPid, InitStart: f.initStart, AgentNsPid: nsPid, Image: spec.Image},
		netFD:  netFD,
		cg:     cg,
		client: agent.NewClient(r.dialer(netFD)),
	}, nil
}

// waitAgent waits for sb's agent to answer.
func (r *Runtime) waitAgent(ctx context.Context, sb *sandbox) error {
	deadline := time.Now().Add(10 * time.Second)
	for {
		_, perr := sb.client.Ping(ctx)
		if perr == nil {
			return nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil || !alive(sb.h.AgentPid, sb.h.AgentStart) {
			return fmt.Errorf("agent did not come up (see %s/logs/sandboxes.log): %w", r.cfg.DataDir, perr)
		}
		time.Sleep(500 * time.Microsecond)
	}
}

// attach connects the sandbox's network namespace (open at netFD) to the bridge as veth, with the port prepared
// for it (a claimed spare's) when there is one, else a new one. A sandbox without an address gets no port: a
// prepared one is removed.
func (r *Runtime) attach(ctx context.Context, spec runtime.Spec, netFD int, veth, prepared string) error {
	if spec.IP == nil {
		if prepared != "" {
			if err := r.cfg.Network.Detach(prepared); err != nil {
				return fmt.Errorf("network: %w", err)
			}
		}
		return nil
	}
	if prepared != "" {
		err := r.cfg.Network.AttachPrepared(ctx, netFD, prepared, spec.IP, veth, spec.Egress)
		if err == nil {
			return nil
		}
		// Gone (the spare's namespace with it, and the pid reused) or refused: the pair was deleted, and a new
		// one goes in its place.
		r.log.Debug("attach prepared port", "sandbox", spec.ID, "port", prepared, "err", err)
	}
	if err := r.cfg.Network.Attach(ctx, netFD, spec.IP, veth, spec.Egress); err != nil {
		return fmt.Errorf("network: %w", err)
	}
	return nil
}

func (r *Runtime) dialer(netFD int) func(ctx context.Context) (net.Conn, error) {
	return func(ctx context.Context) (net.Conn, error) { return dialAbstract(netFD, agent.SocketName) }
}

// sandboxCgroup gives the sandbox its cgroup with spec's limits, holding its agent (hostPid): the cgroup a claimed
// spare was placed in ahead (pooled, by placeSpares), renamed to the sandbox's name; otherwise a new cgroup the
// agent moves into.
func (r *Runtime) sandboxCgroup(spec runtime.Spec, pooled placedSpare, hostPid int) (cgroups.Cgroup, error) {
	if rn, ok := r.cfg.Cgroups.(cgroups.Renamer); ok && pooled.cgroup != "" {
		cg, err := rn.Rename(pooled.cgroup, spec.ID)
		if err == nil {
			if l := limitsOf(spec); l == pooled.limits {
				return cg, nil // placed with these limits already
			}
			if err = cg.Update(limitsOf(spec)); err != nil {
				cg.Kill(context.Background()) //nolint:errcheck // the agent dies with it; the spawn fails
				cg.Delete()                   //nolint:errcheck
				return nil, fmt.Errorf("limit cgroup: %w", err)
			}
			return cg, nil
		}
		// The agent is still in the spare's cgroup: the move below takes it out, and the family's end removes it.
		r.log.Debug("rename spare cgroup", "sandbox", spec.ID, "from", pooled.cgroup, "err", err)
	}
	cg, err := r.cfg.Cgroups.Create(spec.ID, limitsOf(spec))
	if err != nil {
		return nil, fmt.Errorf("create cgroup: %w", err)
	}
	if err := cg.Add(hostPid); err != nil {
		cg.Delete() //nolint:errcheck // empty: the move failed
		return nil, fmt.Errorf("place agent in cgroup: %w", err)
	}
	return cg, nil
}

// newFamilyID names a new family after the sandbox it starts with, and uniquely: fam_<id>_<random>. A name is
// never used twice: a sandbox's records keep its family's name after the family has ended (a paused sandbox's
// handle, a sandbox lost in a restart), and a delete working from such a handle would take a later family of
// the same name for its own and end it (a resumed sandbox's, whose fork children were paused in its old one).
func (r *Runtime) newFamilyID(sandboxID string) string {
	return "fam_" + strings.TrimPrefix(sandboxID, "sbx_") + "_" + newToken()[:8]
}

// Create implements runtime.Runtime.
func (r *Runtime) Create(ctx context.Context, spec runtime.Spec) (_ runtime.Handle, err error) {
	defer r.movesFast()() // the family init and the agent each move into a cgroup
	var undo cleanup
	defer func() {
		if err != nil {
			undo.run()
		}
	}()
	t0 := time.Now()
	phase := func(name string) {
		r.log.Debug("create phase", "sandbox", spec.ID, "phase", name, "ms", msSince(t0))
	}
	if err := r.awaitRetired(ctx, spec.ID); err != nil {
		return runtime.Handle{}, err
	}
	dir, err := r.cfg.Layers.Create(ctx, spec.ID)
	if err != nil {
		return runtime.Handle{}, fmt.Errorf("create layer: %w", err)
	}
	phase("layer")
	undo.add(func() { r.cfg.Layers.Remove(context.Background(), spec.ID) })
	crashpoint.Hit(crashpoint.CreateAfterLayer)
	if err := prepareLayer(dir); err != nil {
		return runtime.Handle{}, fmt.Errorf("prepare layer: %w", err)
	}
	if spec.Populate != nil {
		// The layer is capped before the first byte is restored: restored first and capped after, a snapshot
		// (one whose files were written out in full by an older version, or a crafted one) filled the layer
		// file system that every sandbox shares, whatever its disk_mib. The exact quota follows below, once the
		// overlay is mounted.
		if err := r.limitLayerBytes(spec.ID, populateCap(spec)); err != nil {
			return runtime.Handle{}, err
		}
		if err := spec.Populate(filepath.Join(dir, "upper")); err != nil {
			if errors.Is(err, unix.EDQUOT) {
				err = fmt.Errorf("the snapshot's files do not fit in the sandbox's disk quota (disk_mib %d): %w", spec.DiskMiB, err)
			}
			return runtime.Handle{}, fmt.Errorf("populate layer: %w", err)
		}
		phase("files restored")
		// On disk before the create answers: the caller drops the snapshot the files came from once the
		// sandbox runs, and a host crash or a file system error (the layers' btrfs turned read-only) after
		// that lost them with it, the sandbox listed running with no files. Only these files: syncfs waited
		// for every neighbour's buffered writes too (1-1.4 s for a small resume beside 1.5 GB of them).
		if err := layer.SyncTree(filepath.Join(dir, "upper")); err != nil {
			return runtime.Handle{}, fmt.Errorf("populate layer: sync: %w", err)
		}
	} else if err := r.limitLayer(spec.ID, spec.DiskMiB); err != nil {
		return runtime.Handle{}, err
	}
	phase("populated")
	// A zygote's interpreter is given only to a sandbox whose files do not change an interpreter's start (nor,
	// for one that imported a package ahead, what importing it loads): startup.go.
	upper := filepath.Join(dir, "upper")
	noZygote := spec.Populate != nil && layerChanges(upper, startupPatterns)
	if pkg := preloadFor(spec); pkg != "" && (noZygote || layerChanges(upper, preloadPatterns[pkg])) {
		spec.Preload = nil
	}
	f, zyg := r.takePrestarted(spec)
	if f == nil {
		if f, err = r.startFamily(ctx, r.newFamilyID(spec.ID)); err != nil {
			return runtime.Handle{}, err
		}
	}
	undo.add(f.kill)
	var sb *sandbox
	if zyg != nil && spec.Image == "" && !noZygote {
		sb, err = r.launchFromZygote(ctx, f, zyg, spec, dir, phase)
		if err != nil && ctx.Err() == nil {
			r.log.Warn("fork a zygote failed; starting the interpreter afresh", "sandbox", spec.ID, "err", err)
			sb, err = r.launch(ctx, f, spec, dir, nil)
		}
	} else {
		// Without a zygote, or one it cannot use: another image (the zygote's files are the default image's),
		// or startup files of its own.
		sb, err = r.launch(ctx, f, spec, dir, func(*runtime.Handle) { phase("spawned") })
	}
	if zyg != nil {
		// Only now, the sandbox's agent in the family (or the create failed): a family's init ends once nothing
		// but spares is left in it, so a zygote ended before took the family down under the create (500s for
		// creates on a named image, now and then, under load).
		r.bgEnd(zyg)
	}
	if err != nil {
		return runtime.Handle{}, err
	}
	if spec.Populate != nil {
		// A populated layer (a resume, a template) is held to its exact quota only once its root is mounted:
		// it is restored under populateCap, and the overlay's mount makes its work directory in the layer (at
		// the quota, the mount would come up read-only). Nothing of the sandbox's own has run yet.
		if err := r.limitLayer(spec.ID, spec.DiskMiB); err != nil {
			r.Stop(context.Background(), sb.h) //nolint:errcheck // the undo below removes the rest
			return runtime.Handle{}, err
		}
	}
	phase("started")
	crashpoint.Hit(crashpoint.CreateAfterSpawn)
	return sb.h, nil
}

// launch spawns spec's agent in family f on layer dir, lets adjust rename its handle (nil: none), starts its
// interpreter with spec's env and cwd, and records the sandbox as a member of f. On error it undoes the spawn.
func (r *Runtime) launch(ctx context.Context, f *family, spec runtime.Spec, dir string, adjust func(*runtime.Handle)) (*sandbox, error) {
	sb, err := r.spawn(ctx, f, spec, dir, "")
	if err != nil {
		return nil, err
	}
	if adjust != nil {
		adjust(&sb.h)
	}
	if err := sb.client.Start(ctx, startRequest(spec)); err != nil {
		r.teardown(sb)
		return nil, fmt.Errorf("start sandbox: %w", err)
	}
	r.addMember(f, sb)
	return sb, nil
}

// addMember records sandbox sb, started, as a member of family f.
func (r *Runtime) addMember(f *family, sb *sandbox) {
	r.mu.Lock()
	defer r.mu.Unlock()
	f.members[sb.h.ID] = true
	r.families[f.id] = f
	r.sandboxes[sb.h.ID] = sb
}

// teardown kills a sandbox's processes and releases its cgroup and network (not its layer, not its family).
func (r *Runtime) teardown(sb *sandbox) {
	sb.client.Close()
	if sb.cg != nil {
		if err := sb.cg.Kill(context.Background()); err != nil {
			r.log.Warn("kill sandbox cgroup", "sandbox", sb.h.ID, "err", err)
		}
		if err := sb.cg.Delete(); err != nil {
			r.log.Warn("delete sandbox cgroup", "sandbox", sb.h.ID, "err", err)
		}
	}
	r.cfg.Network.Detach(vethOf(sb.h))
	if sb.netFD > 0 {
		unix.Close(sb.netFD)
		sb.netFD = -1
	}
}

// retire marks id's resources as being removed in the background until the returned function is called
// (awaitRetired).
func (r *Runtime) retire(id string) (done func()) {
	ch := make(chan struct{})
	r.mu.Lock()
	if r.retiring == nil {
		r.retiring = map[string]chan struct{}{}
	}
	r.retiring[id] = ch
	r.mu.Unlock()
	return func() {
		r.mu.Lock()
		if r.retiring[id] == ch {
			delete(r.retiring, id)
		}
		r.mu.Unlock()
		close(ch)
	}
}

// awaitRetired waits until no background clean-up is removing resources named after id (retire).
func (r *Runtime) awaitRetired(ctx context.Context, id string) error {
	r.mu.Lock()
	ch := r.retiring[id]
	r.mu.Unlock()
	if ch == nil {
		return nil
	}
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("create %s: waiting for the clean-up of its earlier resources: %w", id, ctx.Err())
	}
}

// Stop kills a sandbox's processes and releases its cgroup and network, keeping its layer (files survive).
// It works from the handle alone.
func (r *Runtime) Stop(ctx context.Context, h runtime.Handle) error {
	f, sb := r.forget(h)
	r.teardown(sb)
	if f != nil {
		f.kill()
	}
	return nil
}

// forget removes h from the runtime's maps and returns its family if h was the family's last member, and the
// sandbox (reconstructed from the handle when the runtime did not know it).
func (r *Runtime) forget(h runtime.Handle) (*family, *sandbox) {
	r.mu.Lock()
	sb := r.sandboxes[h.ID]
	delete(r.sandboxes, h.ID)
	f := r.families[h.FamilyID]
	last := true
	if f != nil {
		delete(f.members, h.ID)
		last = len(f.members) == 0
		if last {
			delete(r.families, h.FamilyID)
		}
	} else {
		// Unknown family (lost in a restart): it is the last member unless another known sandbox names it.
		for _, o := range r.sandboxes {
			if o.h.FamilyID == h.FamilyID {
				last = false
			}
		}
	}
	r.mu.Unlock()
	if sb == nil {
		sb = &sandbox{h: h, client: agent.NewClient(nil)}
		if cg, err := r.cfg.Cgroups.Load(h.CgroupName()); err == nil {
			sb.cg = cg
		}
	}
	if !last {
		return nil, sb
	}
	if f == nil {
		f = &family{id: h.FamilyID, initPid: h.InitPid, initStart: h.InitStart}
	}
	f.cgroups = r.cfg.Cgroups
	return f, sb
}

// Destroy implements runtime.Runtime. It works from the handle alone, so it also cleans up after sandboxes
// that were lost in a restart.
func (r *Runtime) Destroy(ctx context.Context, h runtime.Handle) error {
	r.Stop(ctx, h) //nolint:errcheck // Stop reports nothing it could act on
	if err := r.cfg.Layers.Remove(ctx, h.Layer()); err != nil {
		return fmt.Errorf("remove layer: %w", err)
	}
	return nil
}

// Recover implements runtime.Runtime. A sandbox found frozen (a fork or pause cut short) is thawed.
func (r *Runtime) Recover(ctx context.Context, h runtime.Handle) error {
	if !alive(h.InitPid, h.InitStart) {
		return errors.New("its family init is gone")
	}
	if !alive(h.AgentPid, h.AgentStart) {
		return errors.New("its agent process is gone")
	}
	cg, err := r.cfg.Cgroups.Load(h.CgroupName())
	if err != nil {
		return fmt.Errorf("cgroup: %w", err)
	}
	// A server killed while a fork or a pause had the sandbox frozen left it so: nothing else freezes it.
	if err := cg.Thaw(ctx); err != nil {
		return fmt.Errorf("thaw: %w", err)
	}
	netFD, err := openNetNS(h.AgentPid)
	if err != nil {
		return err
	}
	sb := &sandbox{h: h, netFD: netFD, cg: cg}
	sb.client = agent.NewClient(r.dialer(netFD))
	pctx, cancel := context.WithTimeout(ctx, recoverPingTimeout)
	_, err = sb.client.Ping(pctx)
	cancel()
	switch {
	case err != nil && pctx.Err() != nil && ctx.Err() == nil && alive(h.AgentPid, h.AgentStart):
		// Alive but silent (stopped from the host, say): it is recovered as it runs, and calls wait for it as
		// they would have before the restart; the server's start does not.
		r.log.Warn("recovered a sandbox whose agent does not answer", "sandbox", h.ID, "waited", recoverPingTimeout)
	case err != nil:
		unix.Close(netFD)
		return fmt.Errorf("agent does not answer: %w", err)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	f := r.families[h.FamilyID]
	if f == nil {
		nfd, err := openNetNS(h.InitPid)
		if err != nil {
			return err
		}
		f = &family{id: h.FamilyID, initPid: h.InitPid, initStart: h.InitStart, netFD: nfd, members: map[string]bool{}, cgroups: r.cfg.Cgroups, network: r.cfg.Network}
		r.families[h.FamilyID] = f
	}
	f.members[h.ID] = true
	r.sandboxes[h.ID] = sb
	return nil
}

// recoverPingTimeout bounds Recover's wait for a sandbox's agent to answer: the server's start recovers its
// sandboxes one by one, and one agent that does not answer must not hold up the others.
const recoverPingTimeout = 5 * time.Second

// KillOrphanFamily kills a family init that no recorded sandbox refers to.
func (r *Runtime) KillOrphanFamily(pid int, start uint64) {
	(&family{initPid: pid, initStart: start}).kill()
}

func vethOf(h runtime.Handle) string {
	if h.Veth != "" {
		return h.Veth
	}
	return network.VethName(h.ID)
}

// Agent implements runtime.Runtime.
func (r *Runtime) Agent(id string) (*agent.Client, error) {
	sb, err := r.running(id)
	if err != nil {
		return nil, err
	}
	return sb.client, nil
}

// RootPath implements runtime.Runtime.
func (r *Runtime) RootPath(h runtime.Handle) string {
	return "/proc/" + strconv.Itoa(h.AgentPid) + "/root"
}

// running returns the runtime's live sandbox id, or a "not running" conflict.
func (r *Runtime) running(id string) (*sandbox, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	sb := r.sandboxes[id]
	if sb == nil {
		return nil, errdefs.New(errdefs.ErrConflict, "sandbox is not running")
	}
	return sb, nil
}

// Configure implements runtime.Runtime.
func (r *Runtime) Configure(ctx context.Context, h runtime.Handle, spec runtime.Spec) error {
	sb, err := r.running(h.ID)
	if err != nil {
		return err
	}
	if err := r.SetEgress(ctx, h, spec.Egress); err != nil {
		return fmt.Errorf("configure %s: %w", h.ID, err)
	}
	if err := sb.cg.Update(limitsOf(spec)); err != nil {
		return err
	}
	if err := r.limitLayer(h.Layer(), spec.DiskMiB); err != nil {
		return err
	}
	if err := sb.client.Start(ctx, startRequest(spec)); err != nil {
		return fmt.Errorf("configure %s: %w", h.ID, err)
	}
	return nil
}

// SetEgress implements runtime.EgressSetter: it replaces the egress policy of a running sandbox's port.
func (r *Runtime) SetEgress(ctx context.Context, h runtime.Handle, egress []string) error {
	if r.cfg.Network == nil {
		return nil
	}
	return r.cfg.Network.SetEgress(ctx, vethOf(h), egress)
}

// movesFast keeps moves into cgroups fast until the returned function is called, where the cgroup manager can
// (see cgroups.MoveWarmer): started as a create or fork begins, the grace period the first move would wait for
// passes while the layers and agents are made.
func (r *Runtime) movesFast() func() {
	if w, ok := r.cfg.Cgroups.(cgroups.MoveWarmer); ok {
		return w.KeepMovesFast()
	}
	return func() {}
}

// populateCap is the cap of spec's layer while its Populate runs (0: none).
func populateCap(spec runtime.Spec) int64 {
	if spec.DiskMiB <= 0 {
		return 0
	}
	return int64(spec.DiskMiB)<<20 + runtime.RestoreSlack + max(spec.PopulateExtra, 0)
}

// limitLayer caps layer id at mib MiB (0: no cap) when the layer driver enforces limits (btrfs with quotas);
// with the copy driver it does nothing.
func (r *Runtime) limitLayer(id string, mib int) error {
	return r.limitLayerBytes(id, int64(mib)<<20)
}

// limitLayerBytes is limitLayer in bytes.
func (r *Runtime) limitLayerBytes(id string, bytes int64) error {
	lim, ok := layer.LimiterOf(r.cfg.Layers)
	if !ok {
		return nil
	}
	if err := lim.SetLimit(id, bytes); err != nil {
		return fmt.Errorf("disk quota: %w", err)
	}
	return nil
}

// Usage implements runtime.Runtime.
func (r *Runtime) Usage(h runtime.Handle) (runtime.Usage, error) {
	r.mu.Lock()
	sb := r.sandboxes[h.ID]
	r.mu.Unlock()
	if sb == nil || sb.cg == nil {
		return runtime.Usage{}, errdefs.New(errdefs.ErrConflict, "sandbox is not running")
	}
	st, err := sb.cg.Stats()
	if err != nil {
		return runtime.Usage{}, err
	}
	// The tasks max_procs limits: the cgroup's less the agent's threads, which have an allowance of their own
	// (limitsOf).
	pids := st.Pids
	if n, err := threadCount(sb.h.AgentPid); err == nil && uint64(n) <= pids {
		pids -= uint64(n)
	}
	u := runtime.Usage{MemoryBytes: st.MemoryBytes, Pids: pids, OOMKills: st.OOMKills, CPUNanos: st.CPUNanos,
		DiskBytes: -1, DiskLimitBytes: -1}
	if lim, ok := layer.LimiterOf(r.cfg.Layers); ok {
		if u.DiskBytes, u.DiskLimitBytes, err = lim.DiskUsage(h.Layer()); err != nil {
			return runtime.Usage{}, err
		}
	}
	return u, nil
}

// Close implements runtime.Runtime: sandboxes keep running and are recovered by the next server. It waits (a
// bounded time) for clean-up still running in the background.
func (r *Runtime) Close() error {
	r.closePrestarted()
	done := make(chan struct{})
	go func() { r.bg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		r.log.Warn("background clean-up still running at shutdown")
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.live.close()
	for _, sb := range r.sandboxes {
		sb.client.Close()
	}
	return nil
}

var _ runtime.Healer = (*Runtime)(nil)

// Lost implements runtime.Healer.
func (r *Runtime) Lost() []runtime.Lost {
	r.mu.Lock()
	defer r.mu.Unlock()
	keys := make([]procKey, 0, 2*len(r.sandboxes))
	for _, sb := range r.sandboxes {
		keys = append(keys, procKey{sb.h.InitPid, sb.h.InitStart}, procKey{sb.h.AgentPid, sb.h.AgentStart})
	}
	dead := r.live.dead(keys)
	if r.polls++; r.cfg.Network != nil && r.polls%portCheckEvery == 0 && r.checking.CompareAndSwap(false, true) {
		go r.checkPorts()
	}
	var out []runtime.Lost
	for _, sb := range r.sandboxes {
		switch {
		case dead[procKey{sb.h.InitPid, sb.h.InitStart}]:
			out = append(out, runtime.Lost{Handle: sb.h, Reason: "its family init died"})
		case dead[procKey{sb.h.AgentPid, sb.h.AgentStart}]:
			out = append(out, runtime.Lost{Handle: sb.h, Reason: "its agent died"})
		}
	}
	return out
}

// Revive implements runtime.Healer: the sandbox restarts in a family of its own (its old family may be gone, or
// busy with its siblings), on its own layer, with a cgroup and veth named as before.
func (r *Runtime) Revive(ctx context.Context, h runtime.Handle, spec runtime.Spec) (_ runtime.Handle, err error) {
	defer r.movesFast()()
	r.Stop(ctx, h) //nolint:errcheck // reports nothing it could act on
	var undo cleanup
	defer func() {
		if err != nil {
			undo.run()
		}
	}()
	f, err := r.startFamily(ctx, r.newFamilyID(h.ID))
	if err != nil {
		return runtime.Handle{}, err
	}
	undo.add(f.kill)
	name := h.CgroupName()
	spec.ID, spec.Image = name, h.Image
	sb, err := r.launch(ctx, f, spec, r.cfg.Layers.Path(h.Layer()), func(nh *runtime.Handle) {
		nh.ID, nh.LayerID, nh.Cgroup, nh.Veth = h.ID, h.Layer(), name, network.VethName(name)
	})
	if err != nil {
		return runtime.Handle{}, err
	}
	return sb.h, nil
}
