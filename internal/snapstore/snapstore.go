// Package snapstore owns where pause snapshots live: a Store of opaque, immutable-once-written objects named
// by slash-separated keys, either a directory under the data directory (Local) or an S3-compatible object
// store (S3). Both stream objects of any size without buffering them whole, make each Put and Copy atomic (an
// object is visible only complete, never torn, and an interrupted write leaves the previous object intact),
// and record a checksum of every object's bytes (Sum) so that a restore can verify what it reads.
package snapstore

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"strings"
	"unicode/utf8"

	"github.com/ramify-dev/ramify/internal/errdefs"
)

// Object describes a stored object.
type Object struct {
	// Key is the object's key, as given to Put.
	Key string
	// Size is the object's length in bytes.
	Size int64
	// Sum is the checksum of the object's bytes: CRC-32C for what Put wrote, SHA-256 for objects of earlier
	// versions, neither where it is not known (objects written by something other than this package, or a
	// Local store whose checksum record was lost in a crash).
	Sum
}

// Store is a snapshot store. Keys are slash-separated relative paths ("sandboxes/abc/upper.tar"); see
// ValidateKey. Errors wrap errdefs sentinels: ErrInvalid for bad keys, ErrNotFound for missing objects.
type Store interface {
	// Name describes the store: "local:<dir>" or "s3://bucket/prefix".
	Name() string
	// Put stores the bytes of r under key, replacing any object there. It streams (memory use does not grow
	// with the object's size), computes the CRC-32C while writing and is atomic: the object becomes visible
	// only once complete, and if r fails or ctx ends the previous object, if any, is left intact.
	Put(ctx context.Context, key string, r io.Reader) (Object, error)
	// Get opens the object for reading; the caller closes it. errdefs.ErrNotFound when absent.
	Get(ctx context.Context, key string) (io.ReadCloser, error)
	// Stat describes the object (Size always, Sum when known). errdefs.ErrNotFound when absent.
	Stat(ctx context.Context, key string) (Object, error)
	// Copy makes dst a byte-identical copy of src (server-side or reflinked where possible), atomically
	// like Put. errdefs.ErrNotFound when src is absent.
	Copy(ctx context.Context, src, dst string) error
	// Delete removes every object whose key starts with prefix (a plain string prefix, as in S3: "a/1"
	// matches "a/1/x" and "a/10"; end it with "/" for a directory-like prefix). Nothing matching is not an
	// error. An empty prefix is refused (errdefs.ErrInvalid) rather than emptying the store.
	Delete(ctx context.Context, prefix string) error
	// List returns the objects whose keys start with prefix ("" for all), sorted by key.
	List(ctx context.Context, prefix string) ([]Object, error)
}

// MaxKeyLen is the longest key accepted, in bytes.
const MaxKeyLen = 1024

// tmpName is a reserved first key component: the S3 store uploads there before publishing an object.
const tmpName = ".ramify-tmp"

// ValidateKey reports (errdefs.ErrInvalid) whether key is unusable: empty, longer than MaxKeyLen, absolute,
// not UTF-8, containing NUL, or with an empty, "." or ".." component (so "a//b" and "a/" are refused too), or
// starting with the reserved component ".ramify-tmp".
func ValidateKey(key string) error {
	bad := func(why string) error {
		return fmt.Errorf("%w: key %q: %s", errdefs.ErrInvalid, truncate(key), why)
	}
	switch {
	case key == "":
		return bad("empty")
	case len(key) > MaxKeyLen:
		return bad(fmt.Sprintf("longer than %d bytes", MaxKeyLen))
	case strings.IndexByte(key, 0) >= 0:
		return bad("contains NUL")
	case !utf8.ValidString(key): // S3 keys are UTF-8, and so are the paths io/fs walks in a Local store
		return bad("not UTF-8")
	case strings.HasPrefix(key, "/"):
		return bad("absolute")
	}
	for i, c := range strings.Split(key, "/") {
		switch c {
		case "", ".", "..":
			return bad(fmt.Sprintf("has a component %q", c))
		}
		if i == 0 && c == tmpName {
			return bad("starts with the reserved " + tmpName)
		}
	}
	return nil
}

// validatePrefix checks a List or Delete prefix: like a key, except that it may be empty, and its last
// component may be partial or empty (a trailing "/").
func validatePrefix(prefix string) error {
	if prefix == "" {
		return nil
	}
	bad := func(why string) error {
		return fmt.Errorf("%w: prefix %q: %s", errdefs.ErrInvalid, truncate(prefix), why)
	}
	switch {
	case len(prefix) > MaxKeyLen:
		return bad(fmt.Sprintf("longer than %d bytes", MaxKeyLen))
	case strings.IndexByte(prefix, 0) >= 0:
		return bad("contains NUL")
	case !utf8.ValidString(prefix):
		return bad("not UTF-8")
	case strings.HasPrefix(prefix, "/"):
		return bad("absolute")
	}
	comps := strings.Split(prefix, "/")
	for _, c := range comps[:len(comps)-1] {
		switch c {
		case "", ".", "..":
			return bad(fmt.Sprintf("has a component %q", c))
		}
	}
	return nil
}

func truncate(s string) string {
	if len(s) > 64 {
		return s[:64] + "..."
	}
	return s
}

func randomName() string {
	var b [12]byte
	if _, err := rand.Read(b[:]); err != nil {
		panic(err) // crypto/rand never fails on Linux
	}
	return hex.EncodeToString(b[:])
}

// ctxReader fails reads once ctx is done, so a Put of an endless reader stops when asked to.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}
