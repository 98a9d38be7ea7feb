package fake

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"sort"
	"strings"
	"sync"

	"github.com/ramify-dev/ramify/internal/errdefs"
	"github.com/ramify-dev/ramify/internal/snapstore"
)

// Snapshots is an in-memory snapstore.Store.
type Snapshots struct {
	mu      sync.Mutex
	faultFn func(ctx context.Context, method, key string) error
	objects map[string][]byte
}

var _ snapstore.Store = (*Snapshots)(nil)

// NewSnapshots returns an empty store.
func NewSnapshots() *Snapshots { return &Snapshots{objects: map[string][]byte{}} }

// SetFault installs f (nil: none), called at the start of Put, Get, Copy and Delete with the method's name and
// the key (or prefix); an error it returns is the method's error.
func (s *Snapshots) SetFault(f func(ctx context.Context, method, key string) error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.faultFn = f
}

func (s *Snapshots) fault(ctx context.Context, method, key string) error {
	if err := ctx.Err(); err != nil {
		return err // as a real store's request would fail
	}
	s.mu.Lock()
	f := s.faultFn
	s.mu.Unlock()
	if f == nil {
		return nil
	}
	return f(ctx, method, key)
}

// Name describes the store.
func (s *Snapshots) Name() string { return "memory" }

// Put stores r's bytes under key, atomically.
func (s *Snapshots) Put(ctx context.Context, key string, r io.Reader) (snapstore.Object, error) {
	if err := snapstore.ValidateKey(key); err != nil {
		return snapstore.Object{}, err
	}
	if err := s.fault(ctx, "Put", key); err != nil {
		return snapstore.Object{}, err
	}
	b, err := io.ReadAll(r)
	if err != nil {
		return snapstore.Object{}, err
	}
	if err := ctx.Err(); err != nil {
		return snapstore.Object{}, err
	}
	s.mu.Lock()
	s.objects[key] = b
	s.mu.Unlock()
	return describe(key, b), nil
}

func describe(key string, b []byte) snapstore.Object {
	h := snapstore.NewCRC32C()
	h.Write(b)
	return snapstore.Object{Key: key, Size: int64(len(b)), Sum: snapstore.Sum{}.Of(h)}
}

func (s *Snapshots) get(key string) ([]byte, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	b, ok := s.objects[key]
	if !ok {
		return nil, fmt.Errorf("%w: object %s", errdefs.ErrNotFound, key)
	}
	return b, nil
}

// Get opens an object.
func (s *Snapshots) Get(ctx context.Context, key string) (io.ReadCloser, error) {
	if err := s.fault(ctx, "Get", key); err != nil {
		return nil, err
	}
	b, err := s.get(key)
	if err != nil {
		return nil, err
	}
	return io.NopCloser(bytes.NewReader(b)), nil
}

// Stat describes an object.
func (s *Snapshots) Stat(ctx context.Context, key string) (snapstore.Object, error) {
	b, err := s.get(key)
	if err != nil {
		return snapstore.Object{}, err
	}
	return describe(key, b), nil
}

// Copy copies src to dst.
func (s *Snapshots) Copy(ctx context.Context, src, dst string) error {
	if err := snapstore.ValidateKey(dst); err != nil {
		return err
	}
	if err := s.fault(ctx, "Copy", dst); err != nil {
		return err
	}
	b, err := s.get(src)
	if err != nil {
		return err
	}
	s.mu.Lock()
	s.objects[dst] = b
	s.mu.Unlock()
	return nil
}

// Delete removes every object under prefix.
func (s *Snapshots) Delete(ctx context.Context, prefix string) error {
	if prefix == "" {
		return fmt.Errorf("%w: empty prefix", errdefs.ErrInvalid)
	}
	if err := s.fault(ctx, "Delete", prefix); err != nil {
		return err
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	for k := range s.objects {
		if strings.HasPrefix(k, prefix) {
			delete(s.objects, k)
		}
	}
	return nil
}

// List returns the objects under prefix, sorted by key.
func (s *Snapshots) List(ctx context.Context, prefix string) ([]snapstore.Object, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []snapstore.Object
	for k, b := range s.objects {
		if strings.HasPrefix(k, prefix) {
			out = append(out, describe(k, b))
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Key < out[j].Key })
	return out, nil
}

// Keys lists every key, sorted (for leak checks).
func (s *Snapshots) Keys() []string {
	objs, _ := s.List(context.Background(), "")
	var out []string
	for _, o := range objs {
		out = append(out, o.Key)
	}
	return out
}
