package image

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// stallTimeout is how long the bootstrap tool may go without printing a line before it is killed (apt and
// especially debootstrap's wget can hang forever on a stalled connection). Tests shorten it.
var stallTimeout = 5 * time.Minute

// killGrace is how long a cancelled command gets to clean up after SIGTERM before it is killed.
const killGrace = 30 * time.Second

// sbinDirs are searched in addition to PATH: daemons often run with a PATH that lacks the sbin directories
// where debootstrap and chroot live.
var sbinDirs = []string{"/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin"}

// findExe returns the path of the executable name, or "".
func findExe(name string) string {
	if p, err := exec.LookPath(name); err == nil {
		return p
	}
	for _, d := range sbinDirs {
		p := filepath.Join(d, name)
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0 {
			return p
		}
	}
	return ""
}

// toolEnv is the environment of the commands the build runs.
func toolEnv() []string {
	env := []string{"LC_ALL=C.UTF-8", "LANG=C.UTF-8", "DEBIAN_FRONTEND=noninteractive", "DEBCONF_NONINTERACTIVE_SEEN=true",
		"HOME=/root", "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
	for _, k := range []string{"http_proxy", "https_proxy", "no_proxy", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "TMPDIR"} {
		if v, ok := os.LookupEnv(k); ok {
			env = append(env, k+"="+v)
		}
	}
	return env
}

// buildRootfsReal runs the bootstrap tool into rootfs, finishes the tree, checks it and shifts its ownership.
func buildRootfsReal(ctx context.Context, o Options, rootfs string) (string, error) {
	if os.Geteuid() != 0 {
		return "", errors.New("building the image needs root (it runs mmdebstrap --mode=root and chowns the tree)")
	}
	rep := newReporter(o.Progress, o.Logger)
	tool, path, err := findTool(ctx, rep)
	if err != nil {
		return "", err
	}
	cache := filepath.Join(o.Dir, ".cache", "apt")
	if err := os.MkdirAll(cache, 0o755); err != nil {
		return "", err
	}
	useCache := !strings.ContainsAny(cache, " \t\n'\"\\$`")
	if !useCache {
		o.Logger.Warn("image: the package cache path contains special characters; not using it", "path", cache)
	}
	include := strings.Join(o.Packages, ",")
	var args []string
	switch tool {
	case "mmdebstrap":
		// dpkg's unsafe-io skips its thousands of fsyncs; the finished tree is synced once (syncfs) before it is
		// moved into place, and an interrupted build is thrown away anyway.
		// The package lists stay (--skip=cleanup/apt/lists), so that apt-get install works in a sandbox.
		args = []string{"--mode=root", "--variant=minbase", "--verbose", "--aptopt=Acquire::Retries \"5\"",
			"--dpkgopt=force-unsafe-io", "--skip=cleanup/apt/lists"}
		if include != "" {
			args = append(args, "--include="+include)
		}
		if useCache {
			// The cache recipe from mmdebstrap(1): keep the essential packages' .debs around, seed the target's
			// archive directory from the cache before apt runs and copy everything back before the cleanup.
			args = append(args, "--skip=essential/unlink",
				`--setup-hook=mkdir -p "$1"/var/cache/apt/archives/`,
				"--setup-hook=sync-in "+cache+" /var/cache/apt/archives/",
				"--customize-hook=sync-out /var/cache/apt/archives "+cache)
		}
		args = append(args, o.Suite, rootfs, o.Mirror)
	case "debootstrap":
		args = []string{"--variant=minbase"}
		if include != "" {
			args = append(args, "--include="+include)
		}
		if useCache {
			args = append(args, "--cache-dir="+cache)
		}
		args = append(args, o.Suite, rootfs, o.Mirror)
	}
	rep.say("building %s with %s from %s (%d extra packages)", o.Suite, tool, o.Mirror, len(o.Packages))
	if err := runLogged(ctx, rep, stallTimeout, path, args...); err != nil {
		return tool, err
	}
	if tool == "debootstrap" {
		// debootstrap leaves no package lists: fetch them, so that apt-get install works in a sandbox.
		rep.say("fetching the package lists")
		if chroot := findExe("chroot"); chroot == "" {
			rep.say("chroot not found: the image has no package lists")
		} else if err := runLogged(ctx, rep, stallTimeout, chroot, rootfs, "apt-get", "update"); err != nil {
			rep.say("apt-get update failed (%v): the image has no package lists", err)
		}
	}
	rep.say("finishing the tree")
	if err := finishTree(rootfs); err != nil {
		return tool, fmt.Errorf("finish tree: %w", err)
	}
	if err := smokeCheck(ctx, rep, rootfs, o.Packages); err != nil {
		return tool, err
	}
	if err := removeDeviceNodes(filepath.Join(rootfs, "dev")); err != nil {
		return tool, fmt.Errorf("finish tree: %w", err)
	}
	if useCache {
		if n, err := pruneCache(cache, rootfs); err != nil {
			o.Logger.Warn("image: pruning the package cache", "err", err)
		} else if n > 0 {
			o.Logger.Debug("image: pruned the package cache", "removed", n)
		}
	}
	rep.say("shifting ownership to %d:%d", o.HostUID, o.HostGID)
	if err := ShiftOwnership(rootfs, o.HostUID, o.HostGID); err != nil {
		return tool, err
	}
	return tool, nil
}

// findTool returns mmdebstrap if installed, else debootstrap, else installs mmdebstrap with apt-get.
func findTool(ctx context.Context, rep *reporter) (name, path string, err error) {
	for _, t := range []string{"mmdebstrap", "debootstrap"} {
		if p := findExe(t); p != "" {
			return t, p, nil
		}
	}
	aptGet := findExe("apt-get")
	if aptGet == "" {
		return "", "", errors.New("neither mmdebstrap nor debootstrap is installed, and there is no apt-get to install mmdebstrap with")
	}
	rep.say("neither mmdebstrap nor debootstrap is installed; installing mmdebstrap with apt-get")
	if err := runLogged(ctx, rep, stallTimeout, aptGet, "install", "-y", "mmdebstrap"); err != nil {
		if ctx.Err() != nil {
			return "", "", err
		}
		rep.say("apt-get install failed; running apt-get update and trying again")
		if err := runLogged(ctx, rep, stallTimeout, aptGet, "update"); err != nil {
			return "", "", fmt.Errorf("install mmdebstrap: %w", err)
		}
		if err := runLogged(ctx, rep, stallTimeout, aptGet, "install", "-y", "mmdebstrap"); err != nil {
			return "", "", fmt.Errorf("install mmdebstrap: %w", err)
		}
	}
	if p := findExe("mmdebstrap"); p != "" {
		rep.say("installed mmdebstrap")
		return "mmdebstrap", p, nil
	}
	return "", "", errors.New("install mmdebstrap: apt-get succeeded but mmdebstrap is not on PATH")
}

// errStalled is the cancel cause when a command printed nothing for too long.
var errStalled = errors.New("stalled")

// maxLine caps the length of one output line; longer lines are split.
const maxLine = 16 << 10

// runLogged runs a command with stdout and stderr merged into rep (progress, debug log, tail for errors). It
// kills the command when ctx ends or when no output line arrived for stall.
func runLogged(ctx context.Context, rep *reporter, stall time.Duration, name string, args ...string) error {
	return runLoggedWith(ctx, rep, stall, nil, name, args...)
}

// runLoggedWith is runLogged with prep adjusting the command before it starts (nil: nothing to adjust).
func runLoggedWith(ctx context.Context, rep *reporter, stall time.Duration, prep func(*exec.Cmd), name string, args ...string) error {
	base := filepath.Base(name)
	rep.resetTail(base)
	rep.log.Debug("image: running", "cmd", name, "args", args)
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	pr, pw, err := os.Pipe()
	if err != nil {
		return err
	}
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Env = toolEnv()
	cmd.Stdout, cmd.Stderr = pw, pw
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return unix.Kill(-cmd.Process.Pid, unix.SIGTERM) }
	cmd.WaitDelay = killGrace
	if prep != nil {
		prep(cmd)
	}
	if err := cmd.Start(); err != nil {
		pr.Close()
		pw.Close()
		return fmt.Errorf("start %s: %w", base, err)
	}
	pw.Close()
	pgid := cmd.Process.Pid

	lines := make(chan struct{}, 1)
	readerDone := make(chan struct{})
	go func() {
		defer close(readerDone)
		sc := bufio.NewScanner(pr)
		sc.Buffer(make([]byte, 64<<10), maxLine*2)
		sc.Split(splitLines)
		for sc.Scan() {
			rep.raw(sc.Text())
			select {
			case lines <- struct{}{}:
			default:
			}
		}
	}()
	waitCh := make(chan error, 1)
	go func() { waitCh <- cmd.Wait() }()

	timer := time.NewTimer(stall)
	defer timer.Stop()
	var waitErr error
loop:
	for {
		select {
		case <-lines:
			timer.Reset(stall)
		case <-timer.C:
			rep.log.Warn("image: command stalled, killing it", "cmd", base, "silent_for", stall)
			cancel(errStalled)
		case waitErr = <-waitCh:
			break loop
		}
	}
	// Let the reader drain what is left; a stray grandchild holding the pipe open must not block us.
	select {
	case <-readerDone:
	case <-time.After(5 * time.Second):
	}
	pr.Close()
	<-readerDone
	if waitErr == nil {
		return nil
	}
	// Whatever is left of the process group (apt methods, dpkg, maintainer scripts) goes too.
	_ = unix.Kill(-pgid, unix.SIGKILL)
	tail := rep.lastLines()
	var quoted string
	if len(tail) > 0 {
		quoted = fmt.Sprintf("\nlast %d lines of output:\n  %s", len(tail), strings.Join(tail, "\n  "))
	}
	switch {
	case errors.Is(context.Cause(ctx), errStalled):
		return fmt.Errorf("%s printed nothing for %s (network stalled?); killed it%s", base, stall, quoted)
	case ctx.Err() != nil:
		return fmt.Errorf("%s: %w", base, context.Cause(ctx))
	}
	return fmt.Errorf("%s failed: %w%s", base, waitErr, quoted)
}

// splitLines is bufio.ScanLines that also ends lines at '\r' (progress bars) and splits over-long lines.
func splitLines(data []byte, atEOF bool) (int, []byte, error) {
	if atEOF && len(data) == 0 {
		return 0, nil, nil
	}
	if i := bytes.IndexAny(data, "\r\n"); i >= 0 {
		if i > maxLine {
			return maxLine, data[:maxLine], nil
		}
		return i + 1, data[:i], nil
	}
	if len(data) >= maxLine {
		return maxLine, data[:maxLine], nil
	}
	if atEOF {
		return len(data), data, nil
	}
	return 0, nil, nil
}

// finishTree writes the files and directories every sandbox expects and drops apt's caches. Files are replaced,
// never written through: a symlink in the tree must not lead a write onto the host.
func finishTree(rootfs string) error {
	for _, d := range []string{"", "etc", "var", "var/cache", "var/lib"} {
		fi, err := os.Lstat(filepath.Join(rootfs, d))
		if err != nil {
			return err
		}
		if !fi.IsDir() {
			return fmt.Errorf("/%s in the image is not a directory", d)
		}
	}
	files := []struct {
		name string
		data []byte
	}{
		{"etc/hostname", []byte("sandbox\n")},
		{"etc/hosts", []byte("127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n")},
		{"etc/resolv.conf", hostResolvConf()},
	}
	for _, f := range files {
		if err := replaceFile(filepath.Join(rootfs, f.name), f.data, 0o644); err != nil {
			return err
		}
	}
	dirs := []struct {
		name string
		mode fs.FileMode
	}{
		{"root", 0o700}, {"tmp", 0o777 | fs.ModeSticky}, {"run", 0o755}, {"proc", 0o555}, {"sys", 0o555}, {"dev", 0o755},
	}
	for _, d := range dirs {
		p := filepath.Join(rootfs, d.name)
		fi, err := os.Lstat(p)
		switch {
		case errors.Is(err, fs.ErrNotExist):
			if err := os.Mkdir(p, 0o700); err != nil {
				return err
			}
			if err := os.Chmod(p, d.mode); err != nil { // Mkdir's mode is subject to umask and has no sticky bit
				return err
			}
		case err != nil:
			return err
		case !fi.IsDir():
			return fmt.Errorf("/%s in the image is not a directory", d.name)
		case d.name == "tmp":
			if err := os.Chmod(p, d.mode); err != nil {
				return err
			}
		}
	}
	// Shrink: downloaded packages. The package lists (var/lib/apt/lists, about 50 MB for bookworm main) stay so
	// that `apt-get install` works in a sandbox whose network reaches the mirror without an `apt-get update`
	// first. The lock files and the _apt-owned partial directories stay, as apt expects them.
	for _, d := range []string{"var/cache/apt/archives", "var/cache/apt/archives/partial"} {
		if err := removeFiles(filepath.Join(rootfs, d), "lock"); err != nil {
			return err
		}
	}
	for _, b := range []string{"pkgcache.bin", "srcpkgcache.bin"} {
		if err := os.Remove(filepath.Join(rootfs, "var/cache/apt", b)); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
	}
	return nil
}

// replaceFile removes whatever is at path and creates a new regular file there.
func replaceFile(path string, data []byte, perm fs.FileMode) error {
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL|unix.O_NOFOLLOW, perm)
	if err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Chmod(path, perm)
}

// removeFiles removes the non-directory entries of dir except those named in keep. A missing dir is fine.
func removeFiles(dir string, keep ...string) error {
	ents, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	for _, e := range ents {
		if e.IsDir() || containsStr(keep, e.Name()) {
			continue
		}
		if err := os.Remove(filepath.Join(dir, e.Name())); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return err
		}
	}
	return nil
}

func containsStr(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// fallbackResolvConf is used when the host has no usable resolv.conf.
const fallbackResolvConf = "nameserver 1.1.1.1\nnameserver 8.8.8.8\n"

// hostResolvConf returns the host's resolver configuration without loopback name servers (a stub resolver
// like systemd-resolved's 127.0.0.53 is unreachable from a sandbox's network namespace). When that leaves no
// name server, it tries systemd-resolved's list of upstream servers, then falls back to public resolvers.
func hostResolvConf() []byte {
	for _, p := range []string{"/etc/resolv.conf", "/run/systemd/resolve/resolv.conf"} {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		if out, ok := filterResolvConf(b); ok {
			return out
		}
	}
	return []byte(fallbackResolvConf)
}

// filterResolvConf drops loopback name servers; ok is false when no name server remains.
func filterResolvConf(b []byte) ([]byte, bool) {
	var out bytes.Buffer
	servers := 0
	for line := range strings.SplitSeq(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) >= 2 && f[0] == "nameserver" {
			if strings.HasPrefix(f[1], "127.") || f[1] == "::1" || f[1] == "0.0.0.0" {
				continue
			}
			servers++
		}
		if strings.TrimSpace(line) == "" {
			continue
		}
		out.WriteString(line)
		out.WriteByte('\n')
	}
	return out.Bytes(), servers > 0
}

// smokeModules are checked with an import when their package is part of the image: package name -> module.
// Importing matplotlib.pyplot also leaves matplotlib's font cache in the image's /root/.cache (HOME is /root), so
// that a sandbox's first plot does not spend half a second building it.
var smokeModules = []struct{ pkg, module string }{
	{"python3-numpy", "numpy"}, {"python3-pandas", "pandas"}, {"python3-dill", "dill"},
	{"python3-matplotlib", "matplotlib.pyplot"}, {"python3-ipython", "IPython"}, {"python3-pip", "pip"},
}

// smokeCheck runs the image's python3 (or, without python3, /bin/true) in a chroot to make sure the tree works.
// It must run before the ownership shift.
func smokeCheck(ctx context.Context, rep *reporter, rootfs string, pkgs []string) error {
	chroot := findExe("chroot")
	if chroot == "" {
		return errors.New("smoke check: chroot not found")
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Minute)
	defer cancel()
	args := []string{rootfs, "/bin/true"}
	if containsStr(pkgs, "python3") {
		var mods []string
		for _, m := range smokeModules {
			if containsStr(pkgs, m.pkg) {
				mods = append(mods, m.module)
			}
		}
		code := "import sys"
		if len(mods) > 0 {
			code = "import " + strings.Join(mods, ", ")
			rep.say("checking that python3 can import %s", strings.Join(mods, ", "))
		} else {
			rep.say("checking that python3 runs")
		}
		args = []string{rootfs, "python3", "-c", code}
	} else {
		rep.say("checking that the image runs")
	}
	if err := runLogged(ctx, rep, 2*time.Minute, chroot, args...); err != nil {
		return fmt.Errorf("smoke check: %w", err)
	}
	return nil
}

// pruneCache removes .deb files from the cache that are not the installed version of a package in rootfs, so
// the cache holds one build's worth of packages instead of growing with every point release.
func pruneCache(cache, rootfs string) (int, error) {
	b, err := os.ReadFile(filepath.Join(rootfs, "var/lib/dpkg/status"))
	if err != nil {
		return 0, err
	}
	want := map[string]bool{}
	for stanza := range strings.SplitSeq(string(b), "\n\n") {
		var pkg, ver, arch string
		for line := range strings.SplitSeq(stanza, "\n") {
			if v, ok := strings.CutPrefix(line, "Package: "); ok {
				pkg = v
			} else if v, ok := strings.CutPrefix(line, "Version: "); ok {
				ver = v
			} else if v, ok := strings.CutPrefix(line, "Architecture: "); ok {
				arch = v
			}
		}
		if pkg != "" && ver != "" && arch != "" {
			want[pkg+"_"+strings.ReplaceAll(ver, ":", "%3a")+"_"+arch+".deb"] = true
		}
	}
	if len(want) == 0 {
		return 0, errors.New("no installed packages found in the image's dpkg status")
	}
	ents, err := os.ReadDir(cache)
	if err != nil {
		return 0, err
	}
	matched := 0
	for _, e := range ents {
		if want[e.Name()] {
			matched++
		}
	}
	if matched == 0 { // the cache does not use apt's file names; leave it alone rather than empty it
		return 0, nil
	}
	n := 0
	for _, e := range ents {
		if e.Type().IsRegular() && strings.HasSuffix(e.Name(), ".deb") && !want[e.Name()] {
			if err := os.Remove(filepath.Join(cache, e.Name())); err == nil {
				n++
			}
		}
	}
	return n, nil
}

// keptDevices are the device nodes the image keeps in /dev: harmless, and needed by programs run in a plain
// chroot of the image (pandas, for one, opens /dev/null on import).
var keptDevices = []string{"null", "zero", "full", "random", "urandom", "tty"}

// removeDeviceNodes deletes the device nodes in the image's /dev other than keptDevices (mmdebstrap's root mode
// also creates console, a host device a shared lower layer should not carry, and ptmx). ptmx becomes the
// usual symlink to pts/ptmx, so a sandbox that mounts its own devpts gets working ptys. Symlinks (fd, stdin,
// ...) and the pts and shm directories stay.
func removeDeviceNodes(dev string) error {
	ents, err := os.ReadDir(dev)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	for _, e := range ents {
		if e.Type()&fs.ModeDevice == 0 || containsStr(keptDevices, e.Name()) {
			continue
		}
		p := filepath.Join(dev, e.Name())
		if err := os.Remove(p); err != nil {
			return err
		}
		if e.Name() == "ptmx" {
			if err := os.Symlink("pts/ptmx", p); err != nil {
				return err
			}
		}
	}
	return nil
}
