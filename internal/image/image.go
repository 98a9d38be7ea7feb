// Package image owns the default sandbox image: a Debian root file system (bookworm by default, built with
// mmdebstrap or debootstrap) that is the read-only lower layer of every sandbox's overlayfs. It builds the
// image once, shifts its ownership into the sandboxes' user-namespace range (container uid/gid 0..65535 map
// to host HostUID.., HostGID..), records what was built in a manifest, and returns the existing image when the
// manifest matches what is asked for. It also builds named images on top of the default one (named.go): the
// default image plus Debian and pip packages, kept as one overlay layer.
//
// On disk, under Options.Dir:
//
//	default/rootfs/        the tree (the overlay lower dir)
//	default/manifest.json  {id, suite, packages, built_at, size_bytes, host_uid, host_gid}
//	.cache/apt/            downloaded .deb files, kept across rebuilds so a rebuild downloads little
//	.default.tmp-XXXX/     a build in progress (removed on failure; stale ones are removed by the next build)
//	.lock                  serialises builds between processes
//	named/<name>/          named images (named.go)
package image

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
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ramify-dev/ramify/internal/errdefs"
)

// FormatVersion is part of every image ID. Bump it when the build steps change in a way that makes images
// built by an older ramify unsuitable, so that Ensure rebuilds them.
const FormatVersion = 2

const (
	// DefaultMirror is the Debian mirror used when neither Options.Mirror nor RAMIFY_DEBIAN_MIRROR is set.
	DefaultMirror = "http://deb.debian.org/debian"
	// DefaultSuite is the Debian suite used when Options.Suite is empty.
	DefaultSuite = "bookworm"
	// DefaultHostID is the host uid and gid that container uid/gid 0 maps to.
	DefaultHostID = 100000
	// MirrorEnv names the environment variable that overrides the default mirror.
	MirrorEnv = "RAMIFY_DEBIAN_MIRROR"

	defaultName  = "default"
	manifestName = "manifest.json"
	rootfsName   = "rootfs"
	tmpPrefix    = ".default.tmp-"
)

// DefaultPackages are installed (with their dependencies) on top of Debian's minbase variant.
var DefaultPackages = []string{
	"python3", "python3-numpy", "python3-pandas", "python3-dill",
	"python3-matplotlib", "python3-ipython", "python3-pip",
	"procps", "iproute2", "ca-certificates", "curl", "less",
	"xz-utils", "bzip2", "unzip", "git", "jq", "file",
}

// Options say where the image lives and what goes into it. Zero values mean the defaults.
type Options struct {
	Dir      string   // images directory, e.g. <data-dir>/images; the default image goes to Dir/default
	Mirror   string   // default DefaultMirror; RAMIFY_DEBIAN_MIRROR overrides when empty
	Suite    string   // default DefaultSuite
	Packages []string // default DefaultPackages
	Progress io.Writer
	Logger   *slog.Logger
	Force    bool // rebuild even if a matching image exists
	// HostUID and HostGID are added to every file's uid and gid after the build; 0 means DefaultHostID.
	HostUID, HostGID int
}

// Image is a built image.
type Image struct {
	Name      string    // "default"
	Rootfs    string    // the root file system, for use as an overlay lower dir
	ID        string    // hash of suite, packages and FormatVersion
	BuiltAt   time.Time // when the build finished
	SizeBytes int64     // the tree's size
}

// manifest is Dir/default/manifest.json.
type manifest struct {
	ID        string    `json:"id"`
	Suite     string    `json:"suite"`
	Packages  []string  `json:"packages"`
	BuiltAt   time.Time `json:"built_at"`
	SizeBytes int64     `json:"size_bytes"`
	HostUID   int       `json:"host_uid"`
	HostGID   int       `json:"host_gid"`
	Mirror    string    `json:"mirror,omitempty"`
	Tool      string    `json:"tool,omitempty"`
}

// pkgNameRE is Debian's package-name syntax (policy 5.6.1), optionally with an architecture qualifier.
var pkgNameRE = lazyRE(`^[a-z0-9][a-z0-9+.-]+(:[a-z0-9-]+)?$`)

var suiteRE = lazyRE(`^[a-z0-9][a-z0-9.-]*$`)

// normalize fills in defaults and validates o. The returned Options has a sorted, de-duplicated package list.
func normalize(o Options) (Options, error) {
	if o.Dir == "" {
		return o, errdefs.New(errdefs.ErrInvalid, "image: Options.Dir is empty")
	}
	dir, err := filepath.Abs(o.Dir)
	if err != nil {
		return o, fmt.Errorf("image: %w", err)
	}
	o.Dir = dir
	if o.Mirror == "" {
		o.Mirror = os.Getenv(MirrorEnv)
	}
	if o.Mirror == "" {
		o.Mirror = DefaultMirror
	}
	if strings.ContainsAny(o.Mirror, " \t\n") || !(strings.HasPrefix(o.Mirror, "http://") ||
		strings.HasPrefix(o.Mirror, "https://") || strings.HasPrefix(o.Mirror, "file:/")) {
		return o, errdefs.New(errdefs.ErrInvalid, fmt.Sprintf("image: bad mirror URL %q", o.Mirror))
	}
	if o.Suite == "" {
		o.Suite = DefaultSuite
	}
	if !suiteRE.MatchString(o.Suite) {
		return o, errdefs.New(errdefs.ErrInvalid, fmt.Sprintf("image: bad suite name %q", o.Suite))
	}
	pkgs := o.Packages
	if pkgs == nil {
		pkgs = DefaultPackages
	}
	clean := make([]string, 0, len(pkgs))
	for _, p := range pkgs {
		p = strings.TrimSpace(p)
		if p == "" {
			continue
		}
		if !pkgNameRE.MatchString(p) {
			return o, errdefs.New(errdefs.ErrInvalid, fmt.Sprintf("image: bad package name %q", p))
		}
		clean = append(clean, p)
	}
	slices.Sort(clean)
	o.Packages = slices.Compact(clean)
	if o.HostUID == 0 {
		o.HostUID = DefaultHostID
	}
	if o.HostGID == 0 {
		o.HostGID = DefaultHostID
	}
	if o.HostUID < 0 || o.HostGID < 0 {
		return o, errdefs.New(errdefs.ErrInvalid, "image: negative HostUID or HostGID")
	}
	if o.Progress == nil {
		o.Progress = io.Discard
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	return o, nil
}

// imageID hashes what determines an image's content: the suite, the (sorted) packages and FormatVersion.
func imageID(suite string, pkgs []string) string {
	h := sha256.New()
	fmt.Fprintf(h, "ramify-image format=%d\nsuite=%s\n", FormatVersion, suite)
	for _, p := range pkgs {
		fmt.Fprintf(h, "pkg=%s\n", p)
	}
	return hex.EncodeToString(h.Sum(nil))[:16]
}

// Load reads the default image's manifest from dir (the images directory, Options.Dir). It returns an error
// matching errdefs.ErrNotFound when there is no built image.
func Load(dir string) (Image, error) {
	img, _, err := load(dir)
	return img, err
}

func load(dir string) (Image, manifest, error) {
	base := filepath.Join(dir, defaultName)
	b, err := os.ReadFile(filepath.Join(base, manifestName))
	if errors.Is(err, fs.ErrNotExist) {
		return Image{}, manifest{}, fmt.Errorf("load image %s: %w", base, errdefs.ErrNotFound)
	}
	if err != nil {
		return Image{}, manifest{}, fmt.Errorf("load image: %w", err)
	}
	var m manifest
	if err := json.Unmarshal(b, &m); err != nil {
		return Image{}, manifest{}, fmt.Errorf("load image: parse %s: %w", filepath.Join(base, manifestName), err)
	}
	rootfs := filepath.Join(base, rootfsName)
	if fi, err := os.Stat(rootfs); err != nil || !fi.IsDir() {
		return Image{}, manifest{}, fmt.Errorf("load image: %s missing: %w", rootfs, errdefs.ErrNotFound)
	}
	return Image{Name: defaultName, Rootfs: rootfs, ID: m.ID, BuiltAt: m.BuiltAt, SizeBytes: m.SizeBytes}, m, nil
}

// Ensure returns the existing default image when its manifest matches o (same ID, same ownership shift) and
// o.Force is false; otherwise it builds the image like Build.
func Ensure(ctx context.Context, o Options) (Image, error) {
	o, err := normalize(o)
	if err != nil {
		return Image{}, err
	}
	unlock, err := lockDir(ctx, o.Dir)
	if err != nil {
		return Image{}, fmt.Errorf("ensure image: %w", err)
	}
	defer unlock()
	if !o.Force {
		img, m, err := load(o.Dir)
		switch {
		case err == nil && matches(m, o):
			o.Logger.Debug("image up to date", "id", img.ID, "rootfs", img.Rootfs)
			return img, nil
		case err == nil:
			fmt.Fprintf(o.Progress, "image: existing image %s does not match the requested one, rebuilding\n", m.ID)
		case errors.Is(err, errdefs.ErrNotFound):
			fmt.Fprintf(o.Progress, "image: no image in %s, building it\n", o.Dir)
		default:
			o.Logger.Warn("image manifest unreadable, rebuilding", "err", err)
			fmt.Fprintf(o.Progress, "image: existing image unreadable (%v), rebuilding\n", err)
		}
	}
	return build(ctx, o)
}

// matches reports whether an existing image's manifest satisfies o.
func matches(m manifest, o Options) bool {
	return m.ID == imageID(o.Suite, o.Packages) && m.HostUID == o.HostUID && m.HostGID == o.HostGID
}

// Build always builds the default image, whether or not one exists. The build happens in Dir/.default.tmp-XXXX
// and is renamed into place only when it succeeded; a failed or cancelled build leaves the previous image as it
// was and removes its temporary directory. Replacing an image that running sandboxes use as their lower dir is
// the caller's business to avoid.
func Build(ctx context.Context, o Options) (Image, error) {
	o, err := normalize(o)
	if err != nil {
		return Image{}, err
	}
	unlock, err := lockDir(ctx, o.Dir)
	if err != nil {
		return Image{}, fmt.Errorf("build image: %w", err)
	}
	defer unlock()
	return build(ctx, o)
}

// buildRootfs populates rootfs (which does not exist yet; its parent does) with a finished, ownership-shifted
// tree and returns the name of the tool used. Tests replace it.
var buildRootfs = buildRootfsReal

// build does Build's work; the caller holds the lock and has normalised o.
func build(ctx context.Context, o Options) (img Image, err error) {
	start := time.Now()
	removeStale(o)
	tmp, err := os.MkdirTemp(o.Dir, tmpPrefix)
	if err != nil {
		return Image{}, fmt.Errorf("build image: %w", err)
	}
	defer func() {
		if err != nil {
			if rerr := removeTree(tmp); rerr != nil {
				o.Logger.Error("image: cannot remove failed build", "dir", tmp, "err", rerr)
				err = fmt.Errorf("%w (and removing %s failed: %v)", err, tmp, rerr)
			}
		}
	}()
	if err := os.Chmod(tmp, 0o755); err != nil {
		return Image{}, fmt.Errorf("build image: %w", err)
	}
	rootfs := filepath.Join(tmp, rootfsName)
	tool, err := buildRootfs(ctx, o, rootfs)
	if err != nil {
		return Image{}, fmt.Errorf("build image: %w", err)
	}
	if err := ctx.Err(); err != nil {
		return Image{}, fmt.Errorf("build image: %w", err)
	}
	if err := syncFS(rootfs); err != nil {
		return Image{}, fmt.Errorf("build image: sync: %w", err)
	}
	size, err := treeSize(rootfs)
	if err != nil {
		return Image{}, fmt.Errorf("build image: %w", err)
	}
	m := manifest{
		ID: imageID(o.Suite, o.Packages), Suite: o.Suite, Packages: o.Packages, BuiltAt: time.Now().UTC(),
		SizeBytes: size, HostUID: o.HostUID, HostGID: o.HostGID, Mirror: o.Mirror, Tool: tool,
	}
	b, err := json.MarshalIndent(m, "", "  ")
	if err != nil {
		return Image{}, fmt.Errorf("build image: %w", err)
	}
	if err := writeFileSync(filepath.Join(tmp, manifestName), append(b, '\n')); err != nil {
		return Image{}, fmt.Errorf("build image: %w", err)
	}
	if err := install(tmp, filepath.Join(o.Dir, defaultName), o); err != nil {
		return Image{}, fmt.Errorf("build image: %w", err)
	}
	fmt.Fprintf(o.Progress, "image: done in %s, %s\n", time.Since(start).Round(time.Second), humanSize(size))
	o.Logger.Info("image built", "id", m.ID, "size_bytes", size, "took", time.Since(start).Round(time.Millisecond))
	return Image{Name: defaultName, Rootfs: filepath.Join(o.Dir, defaultName, rootfsName), ID: m.ID, BuiltAt: m.BuiltAt,
		SizeBytes: size}, nil
}

// install moves the finished build tmp to dst, atomically replacing an existing image, and sets the old one aside.
func install(tmp, dst string, o Options) error {
	if _, err := os.Lstat(dst); errors.Is(err, fs.ErrNotExist) {
		if err := os.Rename(tmp, dst); err != nil {
			return err
		}
		return syncDir(filepath.Dir(dst))
	}
	// Swap the two directories in one step; tmp then holds the old image, which we remove.
	err := unix.Renameat2(unix.AT_FDCWD, tmp, unix.AT_FDCWD, dst, unix.RENAME_EXCHANGE)
	if err != nil {
		// File systems without RENAME_EXCHANGE: move the old image aside first, put it back if that fails.
		old := tmp + ".old"
		if err := os.Rename(dst, old); err != nil {
			return err
		}
		if err := os.Rename(tmp, dst); err != nil {
			if rerr := os.Rename(old, dst); rerr != nil {
				return fmt.Errorf("%w (and restoring the old image failed: %v)", err, rerr)
			}
			return err
		}
		tmp = old
	}
	if err := syncDir(filepath.Dir(dst)); err != nil {
		o.Logger.Warn("image: fsync images dir", "err", err)
	}
	// The replaced image may still be the lower layer of running sandboxes (their overlays hold it open by
	// path): keep it, renamed, rather than pull files from under them.
	kept := filepath.Join(filepath.Dir(dst), fmt.Sprintf("%s%d", replacedPrefix, time.Now().UnixNano()))
	if err := os.Rename(tmp, kept); err != nil {
		o.Logger.Warn("image: cannot set the replaced image aside", "dir", tmp, "err", err)
		return nil
	}
	fmt.Fprintf(o.Progress, "image: the previous image is kept at %s for sandboxes that still use it; remove it once none runs\n", kept)
	return nil
}

// replacedPrefix names the directories of images replaced by a rebuild.
const replacedPrefix = ".replaced-"

// removeStale removes temporary directories left by builds that crashed (the caller holds the lock, so no
// build is running).
func removeStale(o Options) {
	ents, err := os.ReadDir(o.Dir)
	if err != nil {
		return
	}
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), tmpPrefix) {
			p := filepath.Join(o.Dir, e.Name())
			o.Logger.Info("image: removing a stale build directory", "dir", p)
			if err := removeTree(p); err != nil {
				o.Logger.Warn("image: cannot remove a stale build directory", "dir", p, "err", err)
			}
		}
	}
}

// removeTree unmounts anything still mounted below dir (a killed bootstrap tool can leave /proc, /sys or /dev
// mounted in the target, and os.RemoveAll must never descend into those) and then removes dir.
func removeTree(dir string) error {
	mounts, err := mountsUnder(dir)
	if err != nil {
		return err
	}
	for _, m := range mounts { // deepest first
		if err := unix.Unmount(m, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
			return fmt.Errorf("unmount %s: %w", m, err)
		}
	}
	if mounts, err = mountsUnder(dir); err != nil {
		return err
	} else if len(mounts) > 0 {
		return fmt.Errorf("%s still has mounts below it (%s); not removing it", dir, mounts[0])
	}
	return os.RemoveAll(dir)
}

// mountsUnder lists the mount points at or below dir, deepest first.
func mountsUnder(dir string) ([]string, error) {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil, fmt.Errorf("read mountinfo: %w", err)
	}
	dir = filepath.Clean(dir)
	var out []string
	for line := range strings.SplitSeq(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 5 {
			continue
		}
		mp := unescapeMount(f[4])
		if mp == dir || strings.HasPrefix(mp, dir+"/") {
			out = append(out, mp)
		}
	}
	slices.SortFunc(out, func(a, b string) int { return len(b) - len(a) })
	return out, nil
}

// unescapeMount undoes mountinfo's octal escapes (\040 for space etc.).
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			if n, ok := octal3(s[i+1 : i+4]); ok {
				b.WriteByte(n)
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

func octal3(s string) (byte, bool) {
	if len(s) != 3 {
		return 0, false
	}
	var n int
	for _, c := range s {
		if c < '0' || c > '7' {
			return 0, false
		}
		n = n*8 + int(c-'0')
	}
	return byte(n), n < 256
}

// procLocks serialises builds within this process (flock is per open file, so it would do too, but this keeps
// the waiting cheap and ctx-aware).
var procLocks sync.Map // dir -> chan struct{}

// lockDir creates dir and takes an exclusive lock on dir/.lock, waiting until ctx is done.
func lockDir(ctx context.Context, dir string) (func(), error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	chAny, _ := procLocks.LoadOrStore(dir, make(chan struct{}, 1))
	ch := chAny.(chan struct{})
	select {
	case ch <- struct{}{}:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	f, err := os.OpenFile(filepath.Join(dir, ".lock"), os.O_RDWR|os.O_CREATE|unix.O_CLOEXEC, 0o600)
	if err != nil {
		<-ch
		return nil, err
	}
	for {
		err = unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if err == nil {
			break
		}
		if !errors.Is(err, unix.EWOULDBLOCK) && !errors.Is(err, unix.EINTR) {
			f.Close()
			<-ch
			return nil, fmt.Errorf("lock %s: %w", f.Name(), err)
		}
		select {
		case <-ctx.Done():
			f.Close()
			<-ch
			return nil, fmt.Errorf("waiting for another image build: %w", ctx.Err())
		case <-time.After(250 * time.Millisecond):
		}
	}
	return func() {
		unix.Flock(int(f.Fd()), unix.LOCK_UN)
		f.Close()
		<-ch
	}, nil
}

func writeFileSync(path string, data []byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o644)
	if err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// syncFS flushes the whole file system holding dir (one syncfs instead of an fsync per file).
func syncFS(dir string) error {
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return err
	}
	defer unix.Close(fd)
	return unix.Syncfs(fd)
}

func syncDir(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}

// treeSize is the apparent size of the regular files and symlinks under root, counting hard links once.
func treeSize(root string) (int64, error) {
	var total int64
	seen := map[[2]uint64]bool{}
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			return &fs.PathError{Op: "lstat", Path: p, Err: err}
		}
		if st.Nlink > 1 && !d.IsDir() {
			k := [2]uint64{st.Dev, st.Ino}
			if seen[k] {
				return nil
			}
			seen[k] = true
		}
		if t := st.Mode & unix.S_IFMT; t == unix.S_IFREG || t == unix.S_IFLNK {
			total += st.Size
		}
		return nil
	})
	return total, err
}

// humanSize formats n bytes as "412 MB" (decimal units, like the progress lines of apt).
func humanSize(n int64) string {
	switch {
	case n >= 1e9:
		return fmt.Sprintf("%.1f GB", float64(n)/1e9)
	case n >= 1e6:
		return fmt.Sprintf("%d MB", (n+5e5)/1e6)
	case n >= 1e3:
		return fmt.Sprintf("%d kB", (n+500)/1e3)
	}
	return fmt.Sprintf("%d B", n)
}
