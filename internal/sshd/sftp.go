package sshd

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"strconv"
	"sync"
	"time"

	"github.com/pkg/sftp"

	"github.com/ramify-dev/ramify/internal/errdefs"
	"github.com/ramify-dev/ramify/internal/files"
)

// fsHandlers serve sftp from a sandbox's files through the files API (internal/files): every path resolves
// inside the sandbox's root, protected paths stay protected, and what it writes belongs to the sandbox's root
// user. Each request opens the sandbox's files for its own duration only (an upload for as long as it runs), so
// an idle sftp session does not hold back a pause or a destroy. Not supported (SSH_FX_OP_UNSUPPORTED): rename,
// links, truncate and chown, and writes that do not start at offset 0 and go on in order (resuming an upload).
type fsHandlers struct {
	svc Sandboxes
	id  string

	mu      sync.Mutex
	writing map[string]*orderedWriter // uploads in progress, by path: a setstat on them waits for the file
}

func (h *fsHandlers) open() (*files.FS, func(), error) {
	fc, err := h.svc.Files(context.Background(), h.id)
	if err != nil {
		return nil, nil, sftpErr(err)
	}
	return fc.FS, fc.Release, nil
}

// sftpErr maps a files API error to what sftp reports: no such file, or a failure with the error's text.
func sftpErr(err error) error {
	switch {
	case err == nil:
		return nil
	case errors.Is(err, errdefs.ErrNotFound):
		return os.ErrNotExist
	}
	return err
}

// Fileread opens a file for reading.
func (h *fsHandlers) Fileread(r *sftp.Request) (io.ReaderAt, error) {
	fs, release, err := h.open()
	if err != nil {
		return nil, err
	}
	defer release()
	f, _, err := fs.OpenRead(r.Filepath)
	if err != nil {
		return nil, sftpErr(err)
	}
	return f, nil
}

// Filewrite opens a file for writing: it replaces the file (the files API's atomic write) with what is written,
// in order from offset 0, once the client closes it.
func (h *fsHandlers) Filewrite(r *sftp.Request) (io.WriterAt, error) {
	fc, err := h.svc.Files(context.Background(), h.id)
	if err != nil {
		return nil, sftpErr(err)
	}
	fs, release := fc.FS, fc.Release
	if e, err := fs.Stat(r.Filepath); err == nil && e.Type == "dir" {
		release()
		return nil, fmt.Errorf("%s is a directory", r.Filepath)
	}
	pr, pw := io.Pipe()
	// The upload holds the sandbox until the client closes the file: a delete of the sandbox ends it first, and
	// so does a client that sends nothing for uploadIdle (either would otherwise hold a delete or a pause for
	// ever).
	fc.OnStop(func() { pr.CloseWithError(fc.Err(context.Canceled)) })
	w := newUpload(pw)
	mode := os.FileMode(0o644)
	if a := r.Attributes(); a != nil && r.AttrFlags().Permissions {
		mode = a.FileMode().Perm()
	}
	h.mu.Lock()
	if h.writing == nil {
		h.writing = map[string]*orderedWriter{}
	}
	h.writing[r.Filepath] = w
	h.mu.Unlock()
	go func() {
		defer release()
		defer w.idle.Stop()
		_, err := fs.Write(r.Filepath, pr, mode)
		pr.CloseWithError(err) // a failed write stops the client's next WriteAt
		h.mu.Lock()
		if h.writing[r.Filepath] == w {
			delete(h.writing, r.Filepath)
		}
		h.mu.Unlock()
		if err == nil && (w.mode != nil || w.mtime != nil) {
			err = fs.SetAttr(r.Filepath, w.mode, w.mtime)
		}
		w.done <- sftpErr(err)
	}()
	return w, nil
}

// orderedWriter turns sftp's WriteAt calls, which may come out of order, into the stream the files API writes:
// a chunk that comes early waits until the bytes before it have come.
type orderedWriter struct {
	mu      sync.Mutex
	pw      *io.PipeWriter
	idle    *time.Timer // ends the upload when the client sends nothing for uploadIdle (nil: never)
	next    int64
	pending map[int64][]byte
	done    chan error
	closed  bool
	// a setstat (fsetstat) of the file while it is written: applied once it is in place
	mode  *os.FileMode
	mtime *time.Time
}

func newOrderedWriter(pw *io.PipeWriter) *orderedWriter {
	return &orderedWriter{pw: pw, pending: map[int64][]byte{}, done: make(chan error, 1)}
}

// newUpload is the writer of an upload into pw: the pipe's reader gets errUploadIdle once the client has sent
// nothing for uploadIdle.
func newUpload(pw *io.PipeWriter) *orderedWriter {
	w := newOrderedWriter(pw)
	w.idle = time.AfterFunc(uploadIdle, func() { pw.CloseWithError(errUploadIdle) })
	return w
}

// uploadIdle bounds how long an sftp upload may receive nothing: as long as the API's body idle timeout.
var uploadIdle = 30 * time.Second

var errUploadIdle = fmt.Errorf("upload received nothing for %v", uploadIdle)

// maxPending bounds the bytes held for chunks that came early (OpenSSH keeps at most 64 requests of 32 KiB in
// flight).
const maxPending = 16 << 20

func (w *orderedWriter) WriteAt(p []byte, off int64) (int, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.idle != nil {
		w.idle.Reset(uploadIdle) // one that fired has closed the pipe: the write below fails
	}
	if off != w.next {
		if off < w.next {
			return 0, sftp.ErrSSHFxOpUnsupported // rewriting what was written
		}
		held := 0
		for _, b := range w.pending {
			held += len(b)
		}
		if held+len(p) > maxPending {
			return 0, sftp.ErrSSHFxOpUnsupported
		}
		w.pending[off] = append([]byte(nil), p...)
		return len(p), nil
	}
	if _, err := w.pw.Write(p); err != nil {
		return 0, err
	}
	w.next += int64(len(p))
	for {
		b, ok := w.pending[w.next]
		if !ok {
			break
		}
		delete(w.pending, w.next)
		if _, err := w.pw.Write(b); err != nil {
			return 0, err
		}
		w.next += int64(len(b))
	}
	return len(p), nil
}

// Close ends the write; it answers the files API's result: the file is in place when it returns nil.
func (w *orderedWriter) Close() error {
	w.mu.Lock()
	if w.idle != nil {
		w.idle.Stop()
	}
	if w.closed {
		w.mu.Unlock()
		return nil
	}
	w.closed = true
	if len(w.pending) > 0 {
		w.pw.CloseWithError(errors.New("write with a gap: only writes in order from offset 0 are supported"))
	} else {
		w.pw.Close()
	}
	w.mu.Unlock()
	return <-w.done
}

// Filecmd serves mkdir, rmdir, remove and setstat (mode and times).
func (h *fsHandlers) Filecmd(r *sftp.Request) error {
	switch r.Method {
	case "Mkdir", "Rmdir", "Remove", "Setstat":
	default:
		return sftp.ErrSSHFxOpUnsupported
	}
	fs, release, err := h.open()
	if err != nil {
		return err
	}
	defer release()
	switch r.Method {
	case "Mkdir":
		_, err = fs.Mkdir(r.Filepath, false)
	case "Rmdir":
		if e, serr := fs.Stat(r.Filepath); serr == nil && e.Type != "dir" {
			return fmt.Errorf("%s is not a directory", r.Filepath)
		}
		err = fs.Remove(r.Filepath, false)
	case "Remove":
		if e, serr := fs.Stat(r.Filepath); serr == nil && e.Type == "dir" {
			return fmt.Errorf("%s is a directory", r.Filepath)
		}
		err = fs.Remove(r.Filepath, false)
	case "Setstat":
		err = h.setstat(fs, r)
	}
	return sftpErr(err)
}

// setstat applies a setstat's permissions and times (chmod, scp's and sftp -p's preserved mode and times); on
// a file being uploaded, once the upload is in place. A size (truncate) other than the file's, or an owner
// other than root, is refused: files belong to the sandbox's root.
func (h *fsHandlers) setstat(fs *files.FS, r *sftp.Request) error {
	flags, a := r.AttrFlags(), r.Attributes()
	if flags.UidGid && (a.UID != 0 || a.GID != 0) {
		return sftp.ErrSSHFxOpUnsupported
	}
	var mode *os.FileMode
	var mtime *time.Time
	if flags.Permissions {
		m := a.FileMode() & (os.ModePerm | os.ModeSetuid | os.ModeSetgid | os.ModeSticky)
		mode = &m
	}
	if flags.Acmodtime {
		t := time.Unix(int64(a.Mtime), 0)
		mtime = &t
	}
	h.mu.Lock()
	w := h.writing[r.Filepath]
	h.mu.Unlock()
	if w != nil {
		w.mu.Lock()
		defer w.mu.Unlock()
		if flags.Size && a.Size != uint64(w.next) {
			return sftp.ErrSSHFxOpUnsupported
		}
		if mode != nil {
			w.mode = mode
		}
		if mtime != nil {
			w.mtime = mtime
		}
		return nil
	}
	if flags.Size {
		if e, err := fs.Stat(r.Filepath); err != nil || uint64(e.Size) != a.Size {
			return sftp.ErrSSHFxOpUnsupported
		}
	}
	if mode == nil && mtime == nil {
		return nil
	}
	return fs.SetAttr(r.Filepath, mode, mtime)
}

// Filelist serves list, stat (symlinks followed) and readlink.
func (h *fsHandlers) Filelist(r *sftp.Request) (sftp.ListerAt, error) {
	fs, release, err := h.open()
	if err != nil {
		return nil, err
	}
	defer release()
	switch r.Method {
	case "List":
		ents, err := fs.List(r.Filepath)
		if err != nil {
			return nil, sftpErr(err)
		}
		out := make(listerAt, len(ents))
		for i, e := range ents {
			out[i] = fileInfo(e)
		}
		return out, nil
	case "Stat":
		e, err := statFollow(fs, r.Filepath)
		if err != nil {
			return nil, sftpErr(err)
		}
		return listerAt{fileInfo(e)}, nil
	case "Readlink":
		e, err := fs.Stat(r.Filepath)
		if err != nil {
			return nil, sftpErr(err)
		}
		if e.Type != "symlink" {
			return nil, fmt.Errorf("%s is not a symbolic link", r.Filepath)
		}
		e.Name = e.LinkTarget
		return listerAt{fileInfo(e)}, nil
	}
	return nil, sftp.ErrSSHFxOpUnsupported
}

// Lstat describes a file without following a final symlink.
func (h *fsHandlers) Lstat(r *sftp.Request) (sftp.ListerAt, error) {
	fs, release, err := h.open()
	if err != nil {
		return nil, err
	}
	defer release()
	e, err := fs.Stat(r.Filepath)
	if err != nil {
		return nil, sftpErr(err)
	}
	return listerAt{fileInfo(e)}, nil
}

// statFollow is Stat with a final symlink followed (inside the sandbox's root).
func statFollow(fs *files.FS, p string) (files.Entry, error) {
	e, err := fs.Stat(p)
	if err != nil || e.Type != "symlink" {
		return e, err
	}
	if fs.CheckDir(p) == nil {
		e.Type, e.Size, e.Mode, e.LinkTarget = "dir", 0, "0755", ""
		return e, nil
	}
	f, fe, err := fs.OpenRead(p)
	if err != nil {
		return files.Entry{}, err
	}
	f.Close()
	fe.Name, fe.Path = e.Name, e.Path
	return fe, nil
}

type listerAt []os.FileInfo

func (l listerAt) ListAt(dst []os.FileInfo, off int64) (int, error) {
	if off >= int64(len(l)) {
		return 0, io.EOF
	}
	n := copy(dst, l[off:])
	if int(off)+n == len(l) {
		return n, io.EOF
	}
	return n, nil
}

// entryInfo is a files.Entry as an os.FileInfo.
type entryInfo struct{ e files.Entry }

func fileInfo(e files.Entry) os.FileInfo { return entryInfo{e} }

func (i entryInfo) Name() string {
	if i.e.Name == "" {
		return path.Base(i.e.Path)
	}
	return i.e.Name
}
func (i entryInfo) Size() int64        { return i.e.Size }
func (i entryInfo) ModTime() time.Time { return i.e.MTime }
func (i entryInfo) IsDir() bool        { return i.e.Type == "dir" }
func (i entryInfo) Sys() any           { return nil }
func (i entryInfo) Mode() os.FileMode {
	bits, _ := strconv.ParseUint(i.e.Mode, 8, 32)
	m := os.FileMode(bits & 0o777)
	if bits&0o4000 != 0 {
		m |= os.ModeSetuid
	}
	if bits&0o2000 != 0 {
		m |= os.ModeSetgid
	}
	if bits&0o1000 != 0 {
		m |= os.ModeSticky
	}
	switch i.e.Type {
	case "dir":
		m |= os.ModeDir
	case "symlink":
		m |= os.ModeSymlink
	case "other":
		m |= os.ModeIrregular
	}
	return m
}
