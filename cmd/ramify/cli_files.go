package main

import (
	"archive/tar"
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/ramify-dev/ramify/client"
)

func init() {
	registerClient("cp", "copy files and directories: cp ./local <id>:/path, cp <id>:/path ./local", (*cli).cp)
	registerClient("files ls", "list a directory of a sandbox", (*cli).filesLs)
}

// splitRemote parses "<id>:/path". A local path never matches: the part before the colon holds no '/' and the
// part after it is absolute.
func splitRemote(s string) (id, p string, ok bool) {
	id, p, ok = strings.Cut(s, ":")
	if !ok || id == "" || strings.Contains(id, "/") || !strings.HasPrefix(p, "/") {
		return "", "", false
	}
	return id, p, true
}

func (e *cli) cp(ctx context.Context, args []string) error {
	fs, asJSON := e.flags("cp <local> <id>:/path | cp <id>:/path <local>   ('-' as local = stdin / stdout)")
	pos, rest, _, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	pos = append(pos, rest...)
	if len(pos) != 2 {
		return usageError(fs, "cp takes a source and a destination")
	}
	srcID, srcPath, srcRemote := splitRemote(pos[0])
	dstID, dstPath, dstRemote := splitRemote(pos[1])
	var res cpResult
	switch {
	case srcRemote && dstRemote:
		return errors.New("cp: copying between sandboxes is not supported; copy through a local directory")
	case !srcRemote && !dstRemote:
		return usageError(fs, "cp: one side must be <id>:/absolute/path")
	case dstRemote:
		res, err = e.upload(ctx, pos[0], dstID, dstPath)
	default:
		res, err = e.download(ctx, srcID, srcPath, pos[1])
	}
	if err != nil {
		return err
	}
	if *asJSON {
		return e.printJSON(res)
	}
	if res.To != "-" {
		what := fmt.Sprintf("%d bytes", res.Bytes)
		if res.Dir {
			what = fmt.Sprintf("%d files", res.Files)
		}
		fmt.Fprintf(e.stderr, "%s -> %s (%s)\n", res.From, res.To, what)
	}
	return nil
}

// cpResult is what cp did.
type cpResult struct {
	From  string `json:"from"`
	To    string `json:"to"`
	Dir   bool   `json:"dir"`
	Bytes int64  `json:"bytes,omitempty"`
	Files int    `json:"files,omitempty"`
}

// upload copies a local file or directory to the sandbox. Like cp(1), copying into an existing directory (or a
// path ending in '/') puts the source inside it under its own name.
func (e *cli) upload(ctx context.Context, local, id, remote string) (cpResult, error) {
	if local == "-" {
		n, err := e.c.WriteFile(ctx, id, remote, e.stdin, 0)
		return cpResult{From: "-", To: id + ":" + remote, Bytes: n}, err
	}
	fi, err := os.Stat(local)
	if err != nil {
		return cpResult{}, err
	}
	target := remote
	if strings.HasSuffix(remote, "/") {
		target = path.Join(remote, filepath.Base(local))
	} else if st, err := e.c.Stat(ctx, id, remote); err == nil && st.IsDir() {
		target = path.Join(remote, filepath.Base(local))
	} else if err != nil && !errors.Is(err, client.ErrNotFound) {
		return cpResult{}, err
	}
	res := cpResult{From: local, To: id + ":" + target, Dir: fi.IsDir()}
	if !fi.IsDir() {
		f, err := os.Open(local)
		if err != nil {
			return res, err
		}
		defer f.Close()
		res.Bytes, err = e.c.WriteFile(ctx, id, target, f, fi.Mode().Perm())
		return res, err
	}
	// The directory is the target itself; its contents go under it. Creating it first is harmless if the
	// archive route makes it anyway.
	_, _ = e.c.Mkdir(ctx, id, target, true)
	pr, pw := io.Pipe()
	tarDone := make(chan error, 1)
	go func() {
		err := writeTar(pw, local, e.stderr)
		pw.CloseWithError(err)
		tarDone <- err
	}()
	res.Files, err = e.c.UploadArchive(ctx, id, target, pr)
	pr.CloseWithError(errors.New("upload ended")) // unblock the tar writer if the upload stopped early
	if terr := <-tarDone; terr != nil && err == nil {
		err = terr
	}
	return res, err
}

// writeTar writes the contents of dir as a tar stream (names relative to dir). Sockets, devices and pipes are
// skipped with a warning.
func writeTar(w io.Writer, dir string, warn io.Writer) error {
	tw := tar.NewWriter(w)
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil || rel == "." {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		link := ""
		switch mode := info.Mode(); {
		case mode&fs.ModeSymlink != 0:
			if link, err = os.Readlink(p); err != nil {
				return err
			}
		case mode.IsRegular(), mode.IsDir():
		default:
			fmt.Fprintf(warn, "ramify: skipping %s: not a regular file, directory or symlink\n", p)
			return nil
		}
		hdr, err := tar.FileInfoHeader(info, link)
		if err != nil {
			return err
		}
		hdr.Name = filepath.ToSlash(rel)
		if info.IsDir() {
			hdr.Name += "/"
		}
		// Ownership in the sandbox is root's; do not send host users.
		hdr.Uid, hdr.Gid, hdr.Uname, hdr.Gname = 0, 0, "", ""
		if err := tw.WriteHeader(hdr); err != nil {
			return err
		}
		if info.Mode().IsRegular() {
			f, err := os.Open(p)
			if err != nil {
				return err
			}
			_, err = io.Copy(tw, f)
			f.Close()
			return err
		}
		return nil
	})
	if err != nil {
		return err
	}
	return tw.Close()
}

// download copies a file or directory of the sandbox to local. Like cp(1), copying into an existing local
// directory (or a path ending in '/') puts the source inside it under its own name.
func (e *cli) download(ctx context.Context, id, remote, local string) (cpResult, error) {
	from := id + ":" + remote
	if local == "-" {
		rc, err := e.c.ReadFile(ctx, id, remote)
		if err != nil {
			return cpResult{}, err
		}
		defer rc.Close()
		n, err := io.Copy(e.stdout, rc)
		return cpResult{From: from, To: "-", Bytes: n}, err
	}
	st, err := e.c.Stat(ctx, id, remote)
	if err != nil {
		return cpResult{}, err
	}
	target := local
	if fi, err := os.Stat(local); (err == nil && fi.IsDir()) || strings.HasSuffix(local, string(filepath.Separator)) {
		target = filepath.Join(local, path.Base(remote))
	}
	res := cpResult{From: from, To: target, Dir: st.IsDir()}
	if st.IsDir() {
		if err := os.MkdirAll(target, 0o755); err != nil {
			return res, err
		}
		rc, err := e.c.DownloadArchive(ctx, id, remote)
		if err != nil {
			return res, err
		}
		defer rc.Close()
		res.Files, err = extractTar(rc, target)
		return res, err
	}
	rc, err := e.c.ReadFile(ctx, id, remote)
	if err != nil {
		return res, err
	}
	defer rc.Close()
	mode := fs.FileMode(0o644)
	if m, err := strconv.ParseUint(st.Mode, 8, 32); err == nil && m != 0 {
		mode = fs.FileMode(m).Perm()
	}
	f, err := os.OpenFile(target, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, mode)
	if err != nil {
		return res, err
	}
	res.Bytes, err = io.Copy(f, rc)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return res, err
}

// extractTar unpacks a tar stream under dir and returns the number of regular files written. Every operation
// goes through an os.Root, so no entry (a "../" name, a symlink planted by an earlier entry) can write outside
// dir.
func extractTar(r io.Reader, dir string) (int, error) {
	root, err := os.OpenRoot(dir)
	if err != nil {
		return 0, err
	}
	defer root.Close()
	tr := tar.NewReader(r)
	files := 0
	type dirTime struct {
		name  string
		mtime time.Time
	}
	var dirTimes []dirTime
	for {
		hdr, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return files, fmt.Errorf("read archive: %w", err)
		}
		name := path.Clean(strings.TrimLeft(hdr.Name, "/"))
		if name == "." {
			continue
		}
		if name == ".." || strings.HasPrefix(name, "../") {
			return files, fmt.Errorf("archive entry %q points outside the destination", hdr.Name)
		}
		perm := hdr.FileInfo().Mode().Perm()
		if d := path.Dir(name); d != "." {
			if err := root.MkdirAll(d, 0o755); err != nil {
				return files, err
			}
		}
		switch hdr.Typeflag {
		case tar.TypeDir:
			if err := root.MkdirAll(name, perm|0o700); err != nil {
				return files, err
			}
			_ = root.Chmod(name, perm|0o700)
			dirTimes = append(dirTimes, dirTime{name, hdr.ModTime})
		case tar.TypeReg:
			_ = root.Remove(name) // replace a symlink rather than write through it
			f, err := root.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_TRUNC|os.O_EXCL, perm)
			if err != nil {
				return files, err
			}
			_, err = io.Copy(f, tr)
			if cerr := f.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return files, err
			}
			_ = root.Chtimes(name, hdr.ModTime, hdr.ModTime)
			files++
		case tar.TypeSymlink:
			_ = root.Remove(name)
			if err := root.Symlink(hdr.Linkname, name); err != nil {
				return files, err
			}
		case tar.TypeLink:
			_ = root.Remove(name)
			if err := root.Link(path.Clean(strings.TrimLeft(hdr.Linkname, "/")), name); err != nil {
				return files, err
			}
		default:
			// Devices, fifos: not recreated on the client.
		}
	}
	for i := len(dirTimes) - 1; i >= 0; i-- {
		_ = root.Chtimes(dirTimes[i].name, dirTimes[i].mtime, dirTimes[i].mtime)
	}
	return files, nil
}

func (e *cli) filesLs(ctx context.Context, args []string) error {
	fs, asJSON := e.flags("files ls <id> [path] [--json]   (path defaults to /root)")
	pos, _, _, err := parseArgs(fs, args)
	if err != nil {
		return err
	}
	if len(pos) < 1 || len(pos) > 2 {
		return usageError(fs, "files ls takes a sandbox id and a path")
	}
	dir := "/root"
	if len(pos) == 2 {
		dir = pos[1]
	}
	ents, err := e.c.ListFiles(ctx, pos[0], dir)
	if err != nil {
		return err
	}
	if *asJSON {
		return e.printJSON(ents)
	}
	writeEntries(e.stdout, ents)
	return nil
}

// writeEntries prints a directory listing like ls -l: mode, size, mtime, name.
func writeEntries(w io.Writer, ents []client.Entry) {
	width := 1
	for _, en := range ents {
		width = max(width, len(strconv.FormatInt(en.Size, 10)))
	}
	for _, en := range ents {
		name := shownName(en.Name)
		switch en.Type {
		case "dir":
			name += "/"
		case "symlink":
			name += " -> " + shownName(en.LinkTarget)
		}
		mtime := "-               "
		if !en.Mtime.IsZero() {
			mtime = en.Mtime.Local().Format("2006-01-02 15:04")
		}
		fmt.Fprintf(w, "%s  %*d  %s  %s\n", modeString(en.Type, en.Mode), width, en.Size, mtime, name)
	}
}

// shownName is a sandbox file name as the CLI prints it: as it is when it is UTF-8 text, else quoted in Go's
// syntax ("caf\xe9", "\x1b[31mred"), so that a name's bytes never reach the user's terminal as control sequences
// and two names never print alike.
func shownName(name string) string {
	if utf8.ValidString(name) && !strings.ContainsFunc(name, func(r rune) bool { return !unicode.IsPrint(r) && r != ' ' }) {
		return name
	}
	return strconv.Quote(name)
}

// modeString renders type and octal mode as ls does: "drwxr-xr-x".
func modeString(typ, octal string) string {
	c := byte('-')
	switch typ {
	case "dir":
		c = 'd'
	case "symlink":
		c = 'l'
	case "other":
		c = '?'
	}
	m, err := strconv.ParseUint(octal, 8, 32)
	if err != nil {
		return string(c) + "?????????"
	}
	b := []byte{c}
	const rwx = "rwxrwxrwx"
	for i := 0; i < 9; i++ {
		if m&(1<<(8-i)) != 0 {
			b = append(b, rwx[i])
		} else {
			b = append(b, '-')
		}
	}
	return string(b)
}
