package main

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"debug/elf"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/ramify-dev/ramify/internal/agent"
	"github.com/ramify-dev/ramify/internal/api"
	"github.com/ramify-dev/ramify/internal/cgroups"
	"github.com/ramify-dev/ramify/internal/events"
	"github.com/ramify-dev/ramify/internal/image"
	"github.com/ramify-dev/ramify/internal/layer"
	"github.com/ramify-dev/ramify/internal/network"
	ramifyruntime "github.com/ramify-dev/ramify/internal/runtime"
	"github.com/ramify-dev/ramify/internal/runtime/namespaces"
	"github.com/ramify-dev/ramify/internal/sandbox"
	"github.com/ramify-dev/ramify/internal/snapstore"
	"github.com/ramify-dev/ramify/internal/store"
	"github.com/ramify-dev/ramify/internal/ui"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

func init() {
	register("serve", "run the ramify server", serveCmd)
	register("image build", "(re)build the default sandbox image; with --name, build a named image on the server", imageBuildCmd)
	registerHidden("__init", func(ctx context.Context, args []string) error { return namespaces.InitMain(args) })
	registerHidden("__agent", func(ctx context.Context, args []string) error { return agent.Main(args) })
}

// flagUsage prints "Usage: ramify <synopsis>" and the flags, for -h and flag errors.
func flagUsage(fs *flag.FlagSet, synopsis string) func() {
	return func() {
		fmt.Fprintf(fs.Output(), "Usage: ramify %s\n", synopsis)
		fs.PrintDefaults()
	}
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

type serveFlags struct {
	listen, dataDir, apiKey, imageDir, bridge, subnet, layerDriver, logLevel     string
	warmPool, spareAgents, spareAhead, templatePool, prestartFamilies, forkAhead int
	observe                                                                      observeFlags
	ingress                                                                      ingressFlags
	ssh                                                                          sshFlags
	spareIdle, interpreterStall                                                  time.Duration
	snapshotDir, s3Endpoint, s3Bucket, s3Prefix, s3Region, s3Access, s3Secret    string
	s3Secure                                                                     bool
	runtimeBinary                                                                string
	egressAllow                                                                  string
	diskMiB                                                                      int    // default disk quota
	layerQuota                                                                   string // btrfs quota mode
	memOvercommit, cpuOvercommit                                                 float64
}

func parseServeFlags(name string, args []string) (*serveFlags, error) {
	f := &serveFlags{}
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.Usage = flagUsage(fs, "serve [flags]")
	fs.StringVar(&f.listen, "listen", envOr("RAMIFY_LISTEN", "127.0.0.1:7070"), "address to serve on (env RAMIFY_LISTEN)")
	fs.StringVar(&f.dataDir, "data-dir", envOr("RAMIFY_DATA_DIR", "/var/lib/ramify"), "data directory (env RAMIFY_DATA_DIR)")
	fs.StringVar(&f.apiKey, "api-key", os.Getenv("RAMIFY_API_KEY"), "API key; generated and saved in <data-dir>/api-key when unset (env RAMIFY_API_KEY)")
	fs.StringVar(&f.imageDir, "image-dir", os.Getenv("RAMIFY_IMAGE_DIR"), "images directory (default <data-dir>/images; env RAMIFY_IMAGE_DIR)")
	fs.StringVar(&f.bridge, "bridge", envOr("RAMIFY_BRIDGE", "ramify0"), "host bridge for sandbox networking (env RAMIFY_BRIDGE)")
	fs.StringVar(&f.subnet, "subnet", envOr("RAMIFY_SUBNET", "10.213.0.0/16"), "sandbox address range (env RAMIFY_SUBNET)")
	fs.StringVar(&f.egressAllow, "egress-allow", os.Getenv("RAMIFY_EGRESS_ALLOW"),
		"comma-separated IPv4 CIDRs sandboxes with the default egress policy may reach although they are private, reserved, the host's addresses or networks the host is directly connected to (its LAN) (env RAMIFY_EGRESS_ALLOW)")
	fs.StringVar(&f.layerDriver, "layer-driver", os.Getenv("RAMIFY_LAYER_DRIVER"), `writable layer driver: "btrfs", "copy" or empty for automatic (env RAMIFY_LAYER_DRIVER)`)
	fs.IntVar(&f.diskMiB, "disk-mib", envInt("RAMIFY_DISK_MIB", sandbox.DefaultDiskMiB), fmt.Sprintf("disk quota of sandboxes created without disk_mib, %d..%d (env RAMIFY_DISK_MIB)", sandbox.MinDiskMiB, sandbox.MaxDiskMiB))
	fs.StringVar(&f.layerQuota, "layer-quota", envOr("RAMIFY_LAYER_QUOTA", "full"), `how the btrfs layer driver enforces disk_mib: "full" (qgroups), "simple" (simple quotas, kernel 6.7+) or "off" (env RAMIFY_LAYER_QUOTA)`)
	fs.Float64Var(&f.memOvercommit, "mem-overcommit", envFloat("RAMIFY_MEM_OVERCOMMIT", sandbox.DefaultMemOvercommit), "live sandboxes' mem_mib may total this many times the host's memory; past it create, fork and resume answer 503 (env RAMIFY_MEM_OVERCOMMIT)")
	fs.Float64Var(&f.cpuOvercommit, "cpu-overcommit", envFloat("RAMIFY_CPU_OVERCOMMIT", sandbox.DefaultCPUOvercommit), "live sandboxes' vcpu may total this many times the host's CPUs; past it create, fork and resume answer 503 (env RAMIFY_CPU_OVERCOMMIT)")
	fs.IntVar(&f.warmPool, "warm-pool", envInt("RAMIFY_WARM_POOL", 2), "pre-started sandboxes kept ready so that create takes milliseconds (env RAMIFY_WARM_POOL)")
	fs.IntVar(&f.forkAhead, "fork-ahead", envInt("RAMIFY_FORK_AHEAD", 16), "most children made ahead of forks at once, across all sandboxes: a sandbox that forked n children (n up to this) and then sits idle is forked again in the background, and its next fork of up to n children, if it did not change meanwhile, takes their place in milliseconds; 0 for none (env RAMIFY_FORK_AHEAD)")
	fs.IntVar(&f.templatePool, "template-pool", envInt("RAMIFY_TEMPLATE_POOL", 0), "sandboxes kept restored ahead of time per template, so that a create from a template takes milliseconds; each holds the template's session in memory (env RAMIFY_TEMPLATE_POOL)")
	fs.DurationVar(&f.interpreterStall, "interpreter-stall-timeout", envDuration("RAMIFY_INTERPRETER_STALL_TIMEOUT", ramifyruntime.DefaultInterpreterStall), "a pause or fork fails, and its sandbox keeps running, when the interpreter does not answer for this long (code holding the GIL in C code keeps it from answering); one still silent 5 s later is replaced (env RAMIFY_INTERPRETER_STALL_TIMEOUT)")
	fs.DurationVar(&f.spareIdle, "spare-agents-idle", envDuration("RAMIFY_SPARE_AGENTS_IDLE", 5*time.Minute), "how long an unused spare agent lives; 0 for as long as its fork family (env RAMIFY_SPARE_AGENTS_IDLE)")
	fs.IntVar(&f.prestartFamilies, "prestart-families", envInt("RAMIFY_PRESTART_FAMILIES", 1), "families kept started ahead, each with a spare agent and a fresh interpreter to take (~25 MiB each), so that a create the warm pool cannot serve (a resume, a template, a named image, an empty pool) skips starting processes; 0 for none (env RAMIFY_PRESTART_FAMILIES)")
	fs.IntVar(&f.spareAgents, "spare-agents", envInt("RAMIFY_SPARE_AGENTS", 32), "agents a fork family keeps started after a fork (~5.5 MiB each), so that its next fork of up to that many children skips process start-up; 0 for none (env RAMIFY_SPARE_AGENTS)")
	fs.IntVar(&f.spareAhead, "spare-agents-ahead", envInt("RAMIFY_SPARE_AGENTS_AHEAD", 20), "spare agents kept, in all, for the first fork of the sandboxes that most recently ran code (5 per family, ~5.5 MiB each), so that a first fork skips process start-up too; 0 for none (env RAMIFY_SPARE_AGENTS_AHEAD)")
	fs.StringVar(&f.snapshotDir, "snapshot-dir", os.Getenv("RAMIFY_SNAPSHOT_DIR"), "where pause snapshots go (default <data-dir>/snapshots; env RAMIFY_SNAPSHOT_DIR)")
	fs.StringVar(&f.s3Endpoint, "s3-endpoint", os.Getenv("RAMIFY_S3_ENDPOINT"), "host:port of an S3-compatible store for pause snapshots instead of --snapshot-dir (env RAMIFY_S3_ENDPOINT)")
	fs.StringVar(&f.s3Bucket, "s3-bucket", envOr("RAMIFY_S3_BUCKET", "ramify"), "S3 bucket (env RAMIFY_S3_BUCKET)")
	fs.StringVar(&f.s3Prefix, "s3-prefix", os.Getenv("RAMIFY_S3_PREFIX"), "key prefix in the bucket (env RAMIFY_S3_PREFIX)")
	fs.StringVar(&f.s3Region, "s3-region", envOr("RAMIFY_S3_REGION", "us-east-1"), "S3 region (env RAMIFY_S3_REGION)")
	fs.StringVar(&f.s3Access, "s3-access-key", os.Getenv("RAMIFY_S3_ACCESS_KEY"), "S3 access key (env RAMIFY_S3_ACCESS_KEY)")
	fs.StringVar(&f.s3Secret, "s3-secret-key", os.Getenv("RAMIFY_S3_SECRET_KEY"), "S3 secret key (env RAMIFY_S3_SECRET_KEY)")
	fs.BoolVar(&f.s3Secure, "s3-tls", os.Getenv("RAMIFY_S3_TLS") == "1", "use HTTPS for S3 (env RAMIFY_S3_TLS=1)")
	fs.StringVar(&f.runtimeBinary, "runtime-binary", os.Getenv("RAMIFY_RUNTIME_BINARY"), "static ramify binary to run as family init and agent (default: the in-sandbox program make build embeds in this one, else this one, which must then be static)")
	f.observe.register(fs)
	f.ingress.register(fs)
	f.ssh.register(fs)
	fs.StringVar(&f.logLevel, "log-level", envOr("RAMIFY_LOG_LEVEL", "info"), "debug, info, warn or error")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if f.imageDir == "" {
		f.imageDir = filepath.Join(f.dataDir, "images")
	}
	if err := sandbox.ValidDiskMiB(f.diskMiB); err != nil {
		return nil, fmt.Errorf("--disk-mib: %w", err)
	}
	if f.memOvercommit <= 0 || f.cpuOvercommit <= 0 {
		return nil, fmt.Errorf("--mem-overcommit and --cpu-overcommit must be positive")
	}
	if err := f.observe.validate(); err != nil {
		return nil, err
	}
	if err := f.ingress.validate(); err != nil {
		return nil, err
	}
	return f, nil
}

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil {
		return v
	}
	return def
}

func envFloat(name string, def float64) float64 {
	if v, err := strconv.ParseFloat(os.Getenv(name), 64); err == nil {
		return v
	}
	return def
}

func envDuration(name string, def time.Duration) time.Duration {
	if v, err := time.ParseDuration(os.Getenv(name)); err == nil {
		return v
	}
	return def
}

func newLogger(level string) *slog.Logger {
	var l slog.Level
	if err := l.UnmarshalText([]byte(level)); err != nil {
		l = slog.LevelInfo
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: l}))
}

type keySource int

const (
	keyGiven     keySource = iota // --api-key or RAMIFY_API_KEY
	keyFromFile                   // <data-dir>/api-key, saved by an earlier start
	keyGenerated                  // new, saved now
)

// loadOrCreateKey returns the API key: the flag's, else the one saved in the data dir, else a new one (saved).
func loadOrCreateKey(dataDir, given string) (string, keySource, error) {
	path := filepath.Join(dataDir, "api-key")
	if given != "" {
		return given, keyGiven, nil
	}
	if b, err := os.ReadFile(path); err == nil && len(strings.TrimSpace(string(b))) > 0 {
		return strings.TrimSpace(string(b)), keyFromFile, nil
	}
	var raw [24]byte
	if _, err := rand.Read(raw[:]); err != nil {
		return "", keyGiven, err
	}
	key := "rfy_" + hex.EncodeToString(raw[:])
	if err := os.WriteFile(path, []byte(key+"\n"), 0o600); err != nil {
		return "", keyGiven, fmt.Errorf("save api key: %w", err)
	}
	return key, keyGenerated, nil
}

func serveCmd(ctx context.Context, args []string) (err error) {
	f, err := parseServeFlags("serve", args)
	if err != nil {
		return err
	}
	log := newLogger(f.logLevel)
	if os.Geteuid() != 0 {
		return errors.New("ramify serve runs as root (like dockerd): it creates namespaces, cgroups and mounts; sandboxes never run as host root")
	}
	if err := os.MkdirAll(f.dataDir, 0o700); err != nil {
		return fmt.Errorf("data dir: %w", err)
	}
	// Before anything else: a second server on the same data directory would recover (destroy) the first one's
	// sandboxes. The lock lives as long as this process (its descriptor is close-on-exec: sandboxes never hold it).
	lock, err := lockDataDir(f.dataDir)
	if err != nil {
		return err
	}
	defer lock.Close()
	guest, err := guestProgram()
	if err != nil {
		return fmt.Errorf("embedded in-sandbox program: %w", err)
	}
	if err := checkRuntimeBinary(f.runtimeBinary, guest != nil); err != nil {
		return err
	}
	if f.runtimeBinary == "" && guest == nil {
		log.Warn("this binary has no in-sandbox program embedded (built without make build): sandboxes run the whole " +
			"binary as their init and agents, ~1.7 MiB more private memory and ~8 ms more CPU per agent start")
	}
	key, keySource, err := loadOrCreateKey(f.dataDir, f.apiKey)
	if err != nil {
		return err
	}

	// Start-up unwinds what it did when a later step fails: each step that makes something that would outlive
	// this process pushes its undo. Once serving, nothing is undone (sandboxes outlive the server).
	var undo rollback
	defer func() {
		if err != nil {
			undo.run(log)
		}
	}()

	img, err := image.Ensure(ctx, image.Options{Dir: f.imageDir, Progress: os.Stderr, Logger: log})
	if err != nil {
		return fmt.Errorf("default image: %w (rebuild with 'ramify image build')", err)
	}
	// Listen before the steps that touch sandboxes (recovery, the warm pool): a taken port fails here.
	ln, err := net.Listen("tcp", f.listen)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", f.listen, err)
	}
	defer ln.Close()
	layerDir := filepath.Join(f.dataDir, "layers")
	wasMounted := layer.ImageMounted(layerDir)
	layers, err := layer.Open(ctx, layerDir, layer.Options{Driver: f.layerDriver, Logger: log,
		Quota: layer.QuotaMode(f.layerQuota)})
	if err != nil {
		return fmt.Errorf("layers: %w", err)
	}
	defer layers.Close()
	if !wasMounted && layer.ImageMounted(layerDir) {
		undo.push("unmount the layer image", func() error { return layer.UnmountImage(layerDir) })
	}
	if _, ok := layer.LimiterOf(layers); !ok {
		log.Warn("disk_mib is not enforced: the layer driver has no quotas", "driver", layers.Name(), "quota", layer.QuotaModeOf(layers))
	}
	// One cgroup parent per data directory, so that two servers on one host never touch each other's sandboxes;
	// the same digest marks this server's family inits and host veths (what a restart may reclaim).
	sum := sha256.Sum256([]byte(f.dataDir))
	owner := hex.EncodeToString(sum[:4])
	cg, err := cgroups.Detect("ramify/"+owner, log)
	if err != nil {
		return fmt.Errorf("cgroups: %w", err)
	}
	if pr, ok := cg.(cgroups.ParentRemover); ok {
		undo.push("remove the cgroup parent", pr.RemoveCreatedParent)
	}
	if rl, ok := cg.(cgroups.Releaser); ok {
		defer rl.Release() //nolint:errcheck // what is left, the next start takes over or the host's clean-up removes
	}
	netw, err := network.New(ctx, network.Config{Bridge: f.bridge, CIDR: f.subnet, EgressAllow: splitList(f.egressAllow), Owner: owner,
		// Sandboxes resolve through the image's resolv.conf (a copy of the host's for the default image).
		Resolvers: network.ResolversFrom("/etc/resolv.conf", filepath.Join(img.Rootfs, "etc", "resolv.conf"))}, log)
	if err != nil {
		return fmt.Errorf("network: %w", err)
	}
	defer netw.Close()
	st, err := store.Open(f.dataDir)
	if err != nil {
		return err
	}
	defer st.Close()
	rt, err := namespaces.New(namespaces.Config{DataDir: f.dataDir, Binary: f.runtimeBinary, Guest: guest, ImageRootfs: img.Rootfs, Layers: layers,
		Images:  func(name string) ([]string, error) { return image.Lowers(f.imageDir, name) },
		Cgroups: cg, Network: netw, Logger: log, SpareAgents: f.spareAgents, SpareIdle: f.spareIdle, SpareAhead: f.spareAhead, Owner: owner,
		PrestartFamilies: f.prestartFamilies, InterpreterStall: f.interpreterStall})
	if err != nil {
		return err
	}
	defer rt.Close()
	var snaps snapstore.Store
	if f.s3Endpoint != "" {
		snaps, err = snapstore.NewS3(ctx, snapstore.S3Config{Endpoint: f.s3Endpoint, Secure: f.s3Secure, Region: f.s3Region,
			Bucket: f.s3Bucket, Prefix: f.s3Prefix, AccessKey: f.s3Access, SecretKey: f.s3Secret})
	} else {
		dir := f.snapshotDir
		if dir == "" {
			dir = filepath.Join(f.dataDir, "snapshots")
		}
		snaps, err = snapstore.NewLocal(dir)
	}
	if err != nil {
		return fmt.Errorf("snapshot store: %w", err)
	}
	hub := events.New(f.observe.eventHistory)
	// The default local store lives in the data directory, which the lock makes this server's alone.
	exclusive := f.s3Endpoint == "" && f.snapshotDir == ""
	ingressHost, err := f.ingress.open()
	if err != nil {
		return err
	}
	sshAddr, sshHostKey, err := f.ssh.open(f.dataDir, log)
	if err != nil {
		return err
	}
	svc, err := sandbox.New(ctx, sandbox.Config{ImageDir: f.imageDir, IngressHost: ingressHost, SSHAddr: sshAddr, SSHHostKey: sshHostKey, Snapshots: snaps, SnapshotsExclusive: exclusive, Store: st, Runtime: rt, IPs: netw, Logger: log,
		HostUID: namespaces.HostUID, HostGID: namespaces.HostGID, WarmPool: f.warmPool, TemplatePool: f.templatePool, ForkAhead: f.forkAhead, InterpreterStall: f.interpreterStall,
		DiskMiB: f.diskMiB, MemOvercommit: f.memOvercommit, CPUOvercommit: f.cpuOvercommit, Events: hub})
	if err != nil {
		return err
	}
	defer svc.Close()
	undo = nil // from here on sandboxes may use the layers: nothing is undone

	apiSrv := api.New(svc, key, version, log)
	f.observe.wire(svc, hub, apiSrv)
	srv := &http.Server{Handler: ui.With(apiSrv), ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout: 2 * time.Minute}
	srv.RegisterOnShutdown(apiSrv.CloseStreams) // event streams would otherwise hold Shutdown for 30 s
	stopMetrics, err := f.observe.serveMetrics(apiSrv, log)
	if err != nil {
		return err
	}
	defer stopMetrics()
	defer f.ingress.serve(apiSrv, log)()
	stopSSH, err := f.ssh.serve(svc, f.dataDir, log)
	if err != nil {
		return err
	}
	defer stopSSH()
	url := "http://" + ln.Addr().String()
	fmt.Fprintf(os.Stderr, "\nramify %s serving on %s (layers: %s, cgroups v%d, snapshots: %s, image %s)\n", version, url, layers.Name(), cg.Version(), snaps.Name(), img.Rootfs)
	// The key is printed in full only once, when it is generated: later starts (and their logs) say where it is.
	switch keySource {
	case keyGenerated:
		fmt.Fprintf(os.Stderr, "generated an API key, saved in %s (printed this once)\n", filepath.Join(f.dataDir, "api-key"))
		fmt.Fprintf(os.Stderr, "\n  export RAMIFY_API_URL=%s\n  export RAMIFY_API_KEY=%s\n\n  then: ramify sandbox create\n\n", url, key)
	case keyFromFile:
		fmt.Fprintf(os.Stderr, "API key in %s\n\n  export RAMIFY_API_URL=%s\n  export RAMIFY_API_KEY=$(cat %s)\n\n", filepath.Join(f.dataDir, "api-key"), url, filepath.Join(f.dataDir, "api-key"))
	default:
		fmt.Fprintf(os.Stderr, "API key: the one given by --api-key or RAMIFY_API_KEY\n\n  export RAMIFY_API_URL=%s\n\n", url)
	}
	if keySource == keyGenerated {
		fmt.Fprintf(os.Stderr, "  console: %s%s#key=%s\n\n", url, ui.Prefix, key)
	} else {
		fmt.Fprintf(os.Stderr, "  console: %s%s (sign in with the API key, or open %s%s#key=<key>)\n\n", url, ui.Prefix, url, ui.Prefix)
	}
	if p := os.Getenv("RAMIFY_READY_FILE"); p != "" {
		os.WriteFile(p, []byte(url+"\n"), 0o600) //nolint:errcheck // test harness aid
	}

	errc := make(chan error, 1)
	go func() { errc <- srv.Serve(ln) }()
	select {
	case err := <-errc:
		return err
	case <-ctx.Done():
	}
	log.Info("shutting down: finishing in-flight requests; sandboxes keep running and are recovered at the next start")
	sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	return srv.Shutdown(sctx)
}

func imageBuildCmd(ctx context.Context, args []string) error {
	if namedBuild(args) {
		return clientRunner((*cli).imageBuildNamed)(ctx, args)
	}
	fs := flag.NewFlagSet("image build", flag.ContinueOnError)
	fs.Usage = flagUsage(fs, "image build [flags]")
	dataDir := fs.String("data-dir", envOr("RAMIFY_DATA_DIR", "/var/lib/ramify"), "data directory (env RAMIFY_DATA_DIR)")
	imageDir := fs.String("image-dir", os.Getenv("RAMIFY_IMAGE_DIR"), "images directory (default <data-dir>/images)")
	force := fs.Bool("force", true, "rebuild even if an image with the same package list exists")
	// Never set here (namedBuild sends such a command line to the server): listed so that -h shows it.
	fs.String("name", "", "build a named image on the server instead, on top of the default image: --name NAME [--apt pkg,pkg] [--apt-file F] [--pip req] [--requirements F] [--pip-index URL] (ramify image build --name x -h)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *imageDir == "" {
		*imageDir = filepath.Join(*dataDir, "images")
	}
	start := time.Now()
	img, err := image.Ensure(ctx, image.Options{Dir: *imageDir, Progress: os.Stderr, Force: *force, Logger: newLogger("warn")})
	if err != nil {
		return err
	}
	fmt.Printf("image ready: %s (built in %s)\nnew sandboxes use it; running sandboxes keep theirs until destroyed\n", img.Rootfs, time.Since(start).Round(time.Second))
	return nil
}

// splitList splits a comma-separated flag value, dropping empty items and spaces.
func splitList(s string) []string {
	var out []string
	for _, x := range strings.Split(s, ",") {
		if x = strings.TrimSpace(x); x != "" {
			out = append(out, x)
		}
	}
	return out
}

// rollback is the undo stack of a start-up: run undoes, newest first, what the steps so far made.
type rollback []struct {
	what string
	fn   func() error
}

func (r *rollback) push(what string, fn func() error) {
	*r = append(*r, struct {
		what string
		fn   func() error
	}{what, fn})
}

func (r rollback) run(log *slog.Logger) {
	for i := len(r) - 1; i >= 0; i-- {
		if err := r[i].fn(); err != nil {
			log.Warn("start-up failed and could not undo a step", "step", r[i].what, "err", err)
		}
	}
}

// lockDataDir takes an exclusive flock on <dataDir>/lock and writes this process's pid into it. If another
// process holds it, the error names that process. The lock is held until the returned file is closed or the
// process exits.
func lockDataDir(dataDir string) (*os.File, error) {
	path := filepath.Join(dataDir, "lock")
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("lock data directory: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			holder := "another process"
			if b, rerr := os.ReadFile(path); rerr == nil {
				if pid, perr := strconv.Atoi(strings.TrimSpace(string(b))); perr == nil && pid > 0 {
					holder = fmt.Sprintf("ramify serve (pid %d)", pid)
				}
			}
			return nil, fmt.Errorf("data directory %s is in use by %s", dataDir, holder)
		}
		return nil, fmt.Errorf("lock data directory %s: %w", dataDir, err)
	}
	if err := f.Truncate(0); err == nil {
		f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0) //nolint:errcheck // the pid is only for the message
	}
	return f, nil
}

// checkRuntimeBinary refuses a runtime binary (the one given, or this one unless it embeds the in-sandbox
// program, which make build links statically) that is dynamically linked: it is re-executed as family init and
// agent inside a root that has no dynamic loader or libc, so every create would fail with "spawn agent: no such
// file or directory".
func checkRuntimeBinary(given string, embedded bool) error {
	if given == "" && embedded {
		return nil
	}
	path, flag := given, "--runtime-binary "+given
	if path == "" {
		exe, err := os.Executable()
		if err != nil {
			return nil // cannot tell; the runtime reports its own errors
		}
		path, flag = exe, "this binary ("+exe+")"
	}
	dyn, interp, err := dynamicallyLinked(path)
	if err != nil {
		return fmt.Errorf("runtime binary %s: %w", path, err)
	}
	if dyn {
		return fmt.Errorf("%s is dynamically linked (interpreter %s): sandboxes run it as their init and agent in a root "+
			"without a dynamic loader, so every create would fail. Build a static binary: "+
			"CGO_ENABLED=0 go build -o bin/ramify ./cmd/ramify (or 'make build'), or pass a static one with --runtime-binary", flag, interp)
	}
	return nil
}

// dynamicallyLinked reports whether the ELF file at path asks for a program interpreter (a PT_INTERP program
// header: the dynamic loader), and which.
func dynamicallyLinked(path string) (bool, string, error) {
	ef, err := elf.Open(path)
	if err != nil {
		return false, "", err
	}
	defer ef.Close()
	for _, p := range ef.Progs {
		if p.Type == elf.PT_INTERP {
			b, err := io.ReadAll(io.LimitReader(p.Open(), 4096))
			if err != nil {
				return true, "?", nil
			}
			return true, strings.TrimRight(string(b), "\x00"), nil
		}
	}
	return false, "", nil
}
