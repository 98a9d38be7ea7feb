package image

// Named images: a user's image built on top of the default one. Its own files are one overlay layer (what apt
// and pip changed, whiteouts included) kept under Dir/named/<name>/layer; a sandbox on it mounts the overlay
// with two lower dirs, that layer above the default image's rootfs. Building on top of the default image takes
// seconds and stores only the difference, where a build from scratch would take minutes and a full copy.
//
//	named/<name>/layer/          the image's own layer (an overlay upper dir, ownership already shifted)
//	named/<name>/manifest.json   {name, id, base_id, apt, pip, pip_index, built_at, size_bytes}
//	named/.tmp-<name>-XXXX/      a build in progress

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ramify-dev/ramify/internal/errdefs"
)

const (
	namedDir    = "named"
	layerName   = "layer"
	namedTmp    = ".tmp-"
	maxPipReqs  = 256
	maxAptPkgs  = 256
	maxPipReqSz = 512
)

// DefaultName is the name of the default image.
const DefaultName = defaultName

var nameRE = lazyRE(`^[a-z0-9][a-z0-9_.-]{0,62}$`)

// ValidName checks a named image's name: 1 to 63 of a-z, 0-9, '_', '.', '-', starting with a letter or digit.
// "default" names the default image.
func ValidName(name string) error {
	if !nameRE.MatchString(name) {
		return errdefs.New(errdefs.ErrInvalid, fmt.Sprintf("bad image name %q: use 1 to 63 of a-z, 0-9, '_', '.', '-', starting with a letter or digit", name))
	}
	return nil
}

// pipReqRE is a pip requirement without options or URLs: a project name with extras and version specifiers
// ("numpy", "requests[socks]>=2.31,<3", "attrs==23.1.0").
var pipReqRE = lazyRE(`^[A-Za-z0-9][A-Za-z0-9._-]*(\[[A-Za-z0-9._,-]+\])?\s*((===?|~=|!=|<=|>=|<|>)\s*[A-Za-z0-9.*+!_-]+\s*(,\s*(===?|~=|!=|<=|>=|<|>)\s*[A-Za-z0-9.*+!_-]+\s*)*)?$`)

// NamedOptions say what goes into a named image.
type NamedOptions struct {
	Dir  string // images directory (Options.Dir): the default image must be built there
	Name string
	Apt  []string // extra Debian packages
	Pip  []string // pip requirements (installed with pip from PipIndex)
	// PipIndex is the package index pip uses (--index-url); required when Pip is not empty (PyPI is not assumed
	// reachable: Debian's python3-* packages through Apt need no index).
	PipIndex string
	Progress io.Writer
	Logger   *slog.Logger
}

// NamedImage describes a built named image.
type NamedImage struct {
	Name      string    `json:"name"`
	ID        string    `json:"id"`
	BaseID    string    `json:"base_id"` // the default image it was built on
	Apt       []string  `json:"apt"`
	Pip       []string  `json:"pip"`
	PipIndex  string    `json:"pip_index,omitempty"`
	BuiltAt   time.Time `json:"built_at"`
	SizeBytes int64     `json:"size_bytes"` // of its own layer
}

// Normalize validates o and returns it with sorted, de-duplicated lists; errors match errdefs.ErrInvalid.
func (o NamedOptions) Normalize() (NamedOptions, error) {
	if err := ValidName(o.Name); err != nil {
		return o, err
	}
	if o.Name == defaultName {
		return o, errdefs.New(errdefs.ErrInvalid, `"default" is the default image: build it with ramify image build (no name)`)
	}
	bad := func(format string, a ...any) (NamedOptions, error) {
		return o, errdefs.New(errdefs.ErrInvalid, fmt.Sprintf(format, a...))
	}
	var apt []string
	for _, p := range o.Apt {
		if p = strings.TrimSpace(p); p == "" {
			continue
		}
		if !pkgNameRE.MatchString(p) {
			return bad("bad Debian package name %q", p)
		}
		apt = append(apt, p)
	}
	var pip []string
	for _, r := range o.Pip {
		if r = strings.TrimSpace(r); r == "" || strings.HasPrefix(r, "#") {
			continue
		}
		if len(r) > maxPipReqSz || !pipReqRE.MatchString(r) {
			return bad("bad pip requirement %q: give a project name with optional extras and version specifiers (no options, URLs or paths)", r)
		}
		pip = append(pip, r)
	}
	if len(apt) > maxAptPkgs || len(pip) > maxPipReqs {
		return bad("at most %d Debian packages and %d pip requirements", maxAptPkgs, maxPipReqs)
	}
	if len(apt) == 0 && len(pip) == 0 {
		return bad("nothing to build: give Debian packages (apt) or pip requirements (pip)")
	}
	if len(pip) > 0 {
		u, err := url.Parse(o.PipIndex)
		if o.PipIndex == "" {
			return bad("pip requirements need pip_index, the URL of a package index (PEP 503 simple index) this server reaches; or install Debian's python3-* packages through apt")
		}
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || strings.ContainsAny(o.PipIndex, " \t\n") {
			return bad("bad pip_index %q: want an http or https URL", o.PipIndex)
		}
	} else if o.PipIndex != "" {
		return bad("pip_index is set but there are no pip requirements")
	}
	slices.Sort(apt)
	slices.Sort(pip)
	o.Apt, o.Pip = slices.Compact(apt), slices.Compact(pip)
	if o.Apt == nil {
		o.Apt = []string{}
	}
	if o.Pip == nil {
		o.Pip = []string{}
	}
	if o.Progress == nil {
		o.Progress = io.Discard
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	return o, nil
}

// Lowers returns the overlay lower dirs of the image called name in dir, top first: the default image's rootfs
// for "default" (or ""), else the named image's layer above it. An unknown image matches errdefs.ErrNotFound; a
// named image whose base was rebuilt since matches errdefs.ErrConflict.
func Lowers(dir, name string) ([]string, error) {
	base, err := Load(dir)
	if err != nil {
		return nil, err
	}
	if name == "" || name == defaultName {
		return []string{base.Rootfs}, nil
	}
	img, err := LoadNamed(dir, name)
	if err != nil {
		return nil, err
	}
	if img.BaseID != base.ID {
		return nil, errdefs.New(errdefs.ErrConflict, fmt.Sprintf("image %q was built on default image %s, which has been rebuilt (now %s): build %q again",
			name, img.BaseID, base.ID, name))
	}
	return []string{filepath.Join(dir, namedDir, name, layerName), base.Rootfs}, nil
}

// LoadNamed reads a named image's manifest. An unknown name matches errdefs.ErrNotFound.
func LoadNamed(dir, name string) (NamedImage, error) {
	if ValidName(name) != nil {
		return NamedImage{}, errdefs.New(errdefs.ErrNotFound, fmt.Sprintf("image %q not found", name))
	}
	b, err := os.ReadFile(filepath.Join(dir, namedDir, name, manifestName))
	if errors.Is(err, fs.ErrNotExist) {
		return NamedImage{}, errdefs.New(errdefs.ErrNotFound, fmt.Sprintf("image %q not found", name))
	}
	if err != nil {
		return NamedImage{}, fmt.Errorf("load image %s: %w", name, err)
	}
	var m NamedImage
	if err := json.Unmarshal(b, &m); err != nil {
		return NamedImage{}, fmt.Errorf("load image %s: %w", name, err)
	}
	return m, nil
}

// ListNamed returns the named images in dir, by name.
func ListNamed(dir string) ([]NamedImage, error) {
	ents, err := os.ReadDir(filepath.Join(dir, namedDir))
	if errors.Is(err, fs.ErrNotExist) {
		return []NamedImage{}, nil
	}
	if err != nil {
		return nil, fmt.Errorf("list images: %w", err)
	}
	out := []NamedImage{}
	for _, e := range ents {
		if !e.IsDir() || ValidName(e.Name()) != nil {
			continue
		}
		if m, err := LoadNamed(dir, e.Name()); err == nil {
			out = append(out, m)
		}
	}
	return out, nil
}

// RemoveNamed deletes a named image. Whether sandboxes still use it is the caller's business.
func RemoveNamed(ctx context.Context, dir, name string) error {
	if _, err := LoadNamed(dir, name); err != nil {
		return err
	}
	unlock, err := lockDir(ctx, dir)
	if err != nil {
		return fmt.Errorf("remove image %s: %w", name, err)
	}
	defer unlock()
	removeStaleNamed(filepath.Join(dir, namedDir), slog.Default())
	p := filepath.Join(dir, namedDir, name)
	gone := filepath.Join(dir, namedDir, fmt.Sprintf("%s%s-rm%d", namedTmp, name, time.Now().UnixNano()))
	if err := os.Rename(p, gone); err != nil { // the name is free at once; the files go next
		return fmt.Errorf("remove image %s: %w", name, err)
	}
	return removeTree(gone)
}

// BuildNamed builds (or rebuilds) the named image o.Name on top of the default image in o.Dir: it mounts an
// overlay of the default image with an empty layer, runs apt-get and pip in it (inRoot: the tree as their root,
// as root of a user namespace that maps container root as a sandbox's does, so the new files are owned as the
// image's are), and keeps the layer. Progress lines go to o.Progress. The default image is not modified.
func BuildNamed(ctx context.Context, o NamedOptions) (NamedImage, error) {
	o, err := o.Normalize()
	if err != nil {
		return NamedImage{}, err
	}
	if os.Geteuid() != 0 {
		return NamedImage{}, errors.New("building an image needs root")
	}
	unlock, err := lockDir(ctx, o.Dir)
	if err != nil {
		return NamedImage{}, fmt.Errorf("build image %s: %w", o.Name, err)
	}
	defer unlock()
	base, bm, err := load(o.Dir)
	if err != nil {
		return NamedImage{}, fmt.Errorf("build image %s: the default image must be built first: %w", o.Name, err)
	}
	if err := searchable(base.Rootfs); err != nil {
		return NamedImage{}, fmt.Errorf("build image %s: %w", o.Name, err)
	}
	start := time.Now()
	rep := newReporter(o.Progress, o.Logger)
	parent := filepath.Join(o.Dir, namedDir)
	if err := os.MkdirAll(parent, 0o755); err != nil {
		return NamedImage{}, err
	}
	removeStaleNamed(parent, o.Logger)
	tmp, err := os.MkdirTemp(parent, namedTmp+o.Name+"-")
	if err != nil {
		return NamedImage{}, err
	}
	defer func() {
		if err := removeTree(tmp); err != nil && !errors.Is(err, fs.ErrNotExist) {
			o.Logger.Error("image: cannot remove a build directory", "dir", tmp, "err", err)
		}
	}()
	if err := os.Chmod(tmp, 0o755); err != nil {
		return NamedImage{}, err
	}
	layer := filepath.Join(tmp, layerName)
	if err := buildLayer(ctx, rep, o, base.Rootfs, tmp, ids{bm.HostUID, bm.HostGID}); err != nil {
		return NamedImage{}, fmt.Errorf("build image %s: %w", o.Name, err)
	}
	size, err := treeSize(layer)
	if err != nil {
		return NamedImage{}, err
	}
	m := NamedImage{Name: o.Name, ID: namedID(base.ID, o), BaseID: base.ID, Apt: o.Apt, Pip: o.Pip,
		PipIndex: o.PipIndex, BuiltAt: time.Now().UTC(), SizeBytes: size}
	b, _ := json.MarshalIndent(m, "", "  ")
	if err := writeFileSync(filepath.Join(tmp, manifestName), append(b, '\n')); err != nil {
		return NamedImage{}, err
	}
	if err := syncFS(layer); err != nil {
		return NamedImage{}, err
	}
	if err := installNamed(tmp, filepath.Join(parent, o.Name)); err != nil {
		return NamedImage{}, fmt.Errorf("build image %s: %w", o.Name, err)
	}
	rep.say("%s done in %s, %s of its own on top of the default image", o.Name, time.Since(start).Round(time.Second), humanSize(size))
	return m, nil
}

// removeStaleNamed removes what builds and removals killed half-way left in parent (their overlay may still be
// mounted). The caller holds the images directory's lock, so no build is running.
func removeStaleNamed(parent string, log *slog.Logger) {
	ents, err := os.ReadDir(parent)
	if err != nil {
		return
	}
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), namedTmp) {
			p := filepath.Join(parent, e.Name())
			if err := removeTree(p); err != nil {
				log.Warn("image: cannot remove a stale build directory", "dir", p, "err", err)
			}
		}
	}
}

// installNamed moves the finished build into place, replacing (and removing) an older image of the name.
func installNamed(tmp, dst string) error {
	if _, err := os.Lstat(dst); errors.Is(err, fs.ErrNotExist) {
		return os.Rename(tmp, dst)
	}
	if err := unix.Renameat2(unix.AT_FDCWD, tmp, unix.AT_FDCWD, dst, unix.RENAME_EXCHANGE); err != nil {
		return err
	}
	return nil // tmp now holds the old image; the caller removes it
}

func namedID(baseID string, o NamedOptions) string {
	h := sha256.New()
	fmt.Fprintf(h, "ramify-named-image base=%s\nindex=%s\n", baseID, o.PipIndex)
	for _, p := range o.Apt {
		fmt.Fprintf(h, "apt=%s\n", p)
	}
	for _, p := range o.Pip {
		fmt.Fprintf(h, "pip=%s\n", p)
	}
	return hex.EncodeToString(h.Sum(nil))[:16]
}

// searchable checks that container root (host uid HostUID, without capabilities on the host) can reach path:
// the build enters a directory next to it from inside a user namespace.
func searchable(path string) error {
	for d := filepath.Dir(path); ; d = filepath.Dir(d) {
		var st unix.Stat_t
		if err := unix.Stat(d, &st); err != nil {
			return err
		}
		if st.Mode&0o001 == 0 {
			return fmt.Errorf("%s is not searchable by others (mode %o): the build runs as uid %d and must reach the images directory", d, st.Mode&0o777, DefaultHostID)
		}
		if d == "/" {
			return nil
		}
	}
}

// buildLayer mounts overlay(base, tmp/layer) at tmp/merged, runs the package managers in it and unmounts it.
func buildLayer(ctx context.Context, rep *reporter, o NamedOptions, base, tmp string, host ids) error {
	layer, work, merged := filepath.Join(tmp, layerName), filepath.Join(tmp, "work"), filepath.Join(tmp, "merged")
	var st unix.Stat_t
	if err := unix.Stat(base, &st); err != nil {
		return err
	}
	for _, d := range []string{layer, work, merged} {
		if err := os.Mkdir(d, 0o755); err != nil {
			return err
		}
		if err := os.Chown(d, int(st.Uid), int(st.Gid)); err != nil {
			return err
		}
	}
	if err := os.Chmod(layer, fs.FileMode(st.Mode&0o777)); err != nil {
		return err
	}
	if err := mountOverlayAt(base, layer, work, merged); err != nil {
		return err
	}
	defer unmountQuiet(o, merged)
	if len(o.Apt) > 0 {
		if err := aptInstall(ctx, rep, host, merged, o.Apt); err != nil {
			return err
		}
	}
	if len(o.Pip) > 0 {
		if err := pipInstall(ctx, rep, host, merged, o); err != nil {
			return err
		}
	}
	rep.say("checking that python3 runs")
	if err := inRoot(ctx, rep, host, merged, "python3", "-c", "import sys"); err != nil {
		return fmt.Errorf("smoke check: %w", err)
	}
	// What the tools leave behind that no sandbox needs.
	for _, p := range []string{"var/cache/apt/pkgcache.bin", "var/cache/apt/srcpkgcache.bin"} {
		os.Remove(filepath.Join(merged, p)) //nolint:errcheck // absent is fine
	}
	return nil
}

// mountOverlayAt mounts overlay(lower, upper) at merged, on the host.
func mountOverlayAt(lower, upper, work, merged string) error {
	for _, p := range []string{lower, upper, work} {
		if strings.ContainsAny(p, ",:\\") {
			return fmt.Errorf("mount overlay: %q has a character overlayfs options cannot take", p)
		}
	}
	opts := fmt.Sprintf("lowerdir=%s,upperdir=%s,workdir=%s", lower, upper, work)
	if err := unix.Mount("overlay", merged, "overlay", 0, opts); err != nil {
		return fmt.Errorf("mount overlay: %w", err)
	}
	return nil
}

func unmountQuiet(o NamedOptions, merged string) {
	if err := unix.Unmount(merged, unix.MNT_DETACH); err != nil {
		o.Logger.Warn("image: unmount build overlay", "dir", merged, "err", err)
	}
}

func aptInstall(ctx context.Context, rep *reporter, host ids, root string, pkgs []string) error {
	rep.say("installing %s with apt-get", strings.Join(pkgs, ", "))
	args := append([]string{"apt-get", "install", "-y", "--no-install-recommends", "-o", "Acquire::Retries=3", "-o", "Dpkg::Use-Pty=0"}, pkgs...)
	if err := inRoot(ctx, rep, host, root, args...); err != nil {
		if ctx.Err() != nil {
			return err
		}
		rep.say("apt-get install failed; updating the package lists and trying again")
		if err := inRoot(ctx, rep, host, root, "apt-get", "update"); err != nil {
			return fmt.Errorf("apt-get update: %w", err)
		}
		if err := inRoot(ctx, rep, host, root, args...); err != nil {
			return fmt.Errorf("apt-get install: %w", err)
		}
	}
	return inRoot(ctx, rep, host, root, "apt-get", "clean")
}

func pipInstall(ctx context.Context, rep *reporter, host ids, root string, o NamedOptions) error {
	rep.say("installing %s with pip from %s", strings.Join(o.Pip, ", "), o.PipIndex)
	args := []string{"python3", "-m", "pip", "install", "--no-cache-dir", "--disable-pip-version-check",
		"--no-input", "--break-system-packages", "--root-user-action=ignore", "--progress-bar=off",
		"--index-url", o.PipIndex}
	if u, err := url.Parse(o.PipIndex); err == nil && u.Scheme == "http" {
		args = append(args, "--trusted-host", u.Hostname())
	}
	if err := inRoot(ctx, rep, host, root, append(args, o.Pip...)...); err != nil {
		return fmt.Errorf("pip install: %w", err)
	}
	return nil
}

// inRoot runs argv with root as its root file system, as root of a new user namespace mapping container ids
// 0..65535 to host.. (the sandboxes' mapping, as the default image records it), with its own mount, PID, UTS and
// IPC namespaces and /proc; it shares the host's network (the mirror and the pip index are reached from the
// host). The root is entered with pivot_root and the host's tree unmounted, not with chroot, which root of a user
// namespace could leave: what pip runs (an sdist's setup.py) cannot reach the host's files.
func inRoot(ctx context.Context, rep *reporter, host ids, root string, argv ...string) error {
	mount, pivot := findExe("mount"), findExe("pivot_root")
	if mount == "" || pivot == "" {
		return errors.New("building an image needs mount and pivot_root (util-linux) on the host")
	}
	// The overlay is bound onto itself first: pivot_root refuses a mount copied from a more privileged mount
	// namespace as the new root. umount (the image's) reads /proc/self/mountinfo, so /proc comes first.
	const script = `set -e
"$1" --make-rprivate /
"$1" --rbind "$3" "$3"
cd "$3"
"$2" . mnt
cd /
mount -t proc proc /proc
umount -l /mnt
shift 3
exec "$@"`
	args := append([]string{"-c", script, "sh", mount, pivot, root}, argv...)
	return runLoggedWith(ctx, rep, stallTimeout, func(cmd *exec.Cmd) {
		cmd.Dir = "/"
		cmd.SysProcAttr = &syscall.SysProcAttr{
			Cloneflags: syscall.CLONE_NEWUSER | syscall.CLONE_NEWNS | syscall.CLONE_NEWPID | syscall.CLONE_NEWUTS |
				syscall.CLONE_NEWIPC,
			UidMappings:                []syscall.SysProcIDMap{{ContainerID: 0, HostID: host.uid, Size: 65536}},
			GidMappings:                []syscall.SysProcIDMap{{ContainerID: 0, HostID: host.gid, Size: 65536}},
			GidMappingsEnableSetgroups: true,
			Credential:                 &syscall.Credential{Uid: 0, Gid: 0},
			Setpgid:                    true,
		}
	}, "/bin/sh", args...)
}

// ids are the host uid and gid that container root maps to.
type ids struct{ uid, gid int }
