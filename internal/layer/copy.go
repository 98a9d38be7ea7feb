package layer

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/ramify-dev/ramify/internal/errdefs"
)

// tempPrefix starts every temporary name the drivers use. Valid ids never start with '.', so temporary
// entries can neither collide with a layer nor show up in List.
const tempPrefix = ".tmp-"

// tempName returns a fresh hidden name for work on behalf of layer id (op is "clone" or "remove").
func tempName(op, id string) string {
	var b [8]byte
	_, _ = rand.Read(b[:])
	return tempPrefix + op + "-" + id + "-" + hex.EncodeToString(b[:])
}

// listLayers returns the names of the directories in root that are valid layer ids, sorted.
func listLayers(root string) ([]string, error) {
	entries, err := os.ReadDir(root)
	if err != nil {
		return nil, fmt.Errorf("list layers: %w", err)
	}
	ids := make([]string, 0, len(entries))
	for _, e := range entries {
		if !e.IsDir() || ValidateID(e.Name()) != nil {
			continue
		}
		ids = append(ids, e.Name())
	}
	sort.Strings(ids)
	return ids, nil
}

// listTemps returns the temporary entries in root.
func listTemps(root string) []string {
	entries, err := os.ReadDir(root)
	if err != nil {
		return nil
	}
	var names []string
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), tempPrefix) {
			names = append(names, e.Name())
		}
	}
	return names
}

// copyDriver keeps each layer as a plain directory under root and clones by copying (with reflinks where the
// file system supports them).
type copyDriver struct {
	root   string
	log    *slog.Logger
	copier *copier
}

func newCopyDriver(root string, log *slog.Logger) (*copyDriver, error) {
	if err := os.MkdirAll(root, 0o700); err != nil {
		return nil, fmt.Errorf("create layer root %s: %w", root, err)
	}
	d := &copyDriver{root: root, log: log, copier: &copier{}}
	for _, name := range listTemps(root) {
		if err := removeTree(filepath.Join(root, name)); err != nil {
			log.Warn("remove leftover temporary layer", "path", filepath.Join(root, name), "err", err)
		}
	}
	return d, nil
}

func (d *copyDriver) Name() string { return "copy" }

func (d *copyDriver) Path(id string) string { return filepath.Join(d.root, id) }

func (d *copyDriver) List() ([]string, error) { return listLayers(d.root) }

func (d *copyDriver) Close() error { return nil }

func (d *copyDriver) Create(ctx context.Context, id string) (string, error) {
	if err := ValidateID(id); err != nil {
		return "", fmt.Errorf("create layer: %w", err)
	}
	if err := ctx.Err(); err != nil {
		return "", fmt.Errorf("create layer %s: %w", id, err)
	}
	p := d.Path(id)
	if err := unix.Mkdir(p, 0o755); err != nil {
		if errors.Is(err, unix.EEXIST) {
			return "", fmt.Errorf("create layer %s: %w", id, errdefs.New(errdefs.ErrConflict, "layer "+id+" already exists"))
		}
		return "", fmt.Errorf("create layer %s: %w", id, err)
	}
	if err := unix.Chmod(p, 0o755); err != nil { // independent of the umask
		_ = unix.Rmdir(p)
		return "", fmt.Errorf("create layer %s: %w", id, err)
	}
	return p, nil
}

func (d *copyDriver) Clone(ctx context.Context, src, dst string) (string, error) {
	if err := ValidateID(src); err != nil {
		return "", fmt.Errorf("clone layer %s: source: %w", dst, err)
	}
	if err := ValidateID(dst); err != nil {
		return "", fmt.Errorf("clone layer %s: %w", src, err)
	}
	if err := ctx.Err(); err != nil {
		return "", fmt.Errorf("clone layer %s to %s: %w", src, dst, err)
	}
	srcPath, dstPath := d.Path(src), d.Path(dst)
	if fi, err := os.Lstat(srcPath); err != nil || !fi.IsDir() {
		if err == nil || errors.Is(err, os.ErrNotExist) {
			return "", fmt.Errorf("clone layer %s to %s: %w", src, dst, errdefs.New(errdefs.ErrNotFound, "layer "+src+" not found"))
		}
		return "", fmt.Errorf("clone layer %s to %s: %w", src, dst, err)
	}
	if _, err := os.Lstat(dstPath); err == nil {
		return "", fmt.Errorf("clone layer %s to %s: %w", src, dst, errdefs.New(errdefs.ErrConflict, "layer "+dst+" already exists"))
	}
	tmp := filepath.Join(d.root, tempName("clone", dst))
	if err := d.copier.copyTree(ctx, srcPath, tmp, false); err != nil {
		_ = removeTree(tmp)
		return "", fmt.Errorf("clone layer %s to %s: %w", src, dst, err)
	}
	if err := unix.Renameat2(unix.AT_FDCWD, tmp, unix.AT_FDCWD, dstPath, unix.RENAME_NOREPLACE); err != nil {
		_ = removeTree(tmp)
		if errors.Is(err, unix.EEXIST) {
			return "", fmt.Errorf("clone layer %s to %s: %w", src, dst, errdefs.New(errdefs.ErrConflict, "layer "+dst+" already exists"))
		}
		return "", fmt.Errorf("clone layer %s to %s: %w", src, dst, err)
	}
	return dstPath, nil
}

func (d *copyDriver) Remove(ctx context.Context, id string) error {
	if err := ValidateID(id); err != nil {
		return fmt.Errorf("remove layer: %w", err)
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("remove layer %s: %w", id, err)
	}
	// Rename first so that an interrupted removal never leaves a half-deleted layer under its id; Open sweeps
	// leftover temporary names.
	tmp := filepath.Join(d.root, tempName("remove", id))
	if err := unix.Rename(d.Path(id), tmp); err != nil {
		if errors.Is(err, unix.ENOENT) {
			return nil
		}
		return fmt.Errorf("remove layer %s: %w", id, err)
	}
	if err := removeTree(tmp); err != nil {
		return fmt.Errorf("remove layer %s: %w", id, err)
	}
	return nil
}
