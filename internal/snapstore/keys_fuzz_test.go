package snapstore

import (
	"bytes"
	"context"
	"errors"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ramify-dev/ramify/internal/errdefs"
)

// FuzzLocalKeys drives a Local store with arbitrary keys and prefixes. Keys name files under the store's
// directory, so a bad key must never reach a path outside it: ValidateKey accepts only clean relative keys
// (ErrInvalid for the rest, and every method refuses them), an accepted key round-trips through
// Put/Stat/Get/List, and Delete(prefix) removes exactly the objects whose keys start with prefix — nothing is
// ever created or removed outside the store's directory, or outside objects/, tmp/ and sha256/ in it.
func FuzzLocalKeys(f *testing.F) {
	for _, s := range [][2]string{
		{"sandboxes/a/layer.tar", "sandboxes/a/"}, {"a", "a"}, {"../escape", ".."}, {"/abs", "/"}, {"a//b", "a/"},
		{"a/./b", "a/."}, {"a/../b", "a/.."}, {".ramify-tmp/x", ".ramify-tmp"}, {"x/.ramify-tmp", "x/"},
		{"keep", "kee"}, {"keep/me", "keep/"}, {"a\x00b", "a\x00"}, {"", ""}, {strings.Repeat("k", 1025), "k"},
		{strings.Repeat("n", 300), "n"}, {"..a", ".."}, {"a/", "a"}, {"ü/ä", "ü"}, {"a\\b", "a\\"}, {"...", "..."},
	} {
		f.Add(s[0], s[1])
	}
	f.Fuzz(func(t *testing.T, key, prefix string) {
		ctx := context.Background()
		base := t.TempDir()
		dir := filepath.Join(base, "store")
		l, err := NewLocal(dir)
		if err != nil {
			t.Fatal(err)
		}
		defer l.Close()
		if _, err := l.Put(ctx, "keep/me", strings.NewReader("kept")); err != nil {
			t.Fatal(err)
		}
		kerr := ValidateKey(key)
		if kerr != nil {
			if !errors.Is(kerr, errdefs.ErrInvalid) {
				t.Fatalf("ValidateKey(%q) = %v, want ErrInvalid", key, kerr)
			}
		} else if path.Clean(key) != key || path.IsAbs(key) || key == "." || strings.HasPrefix(key, "../") || key == ".." ||
			strings.Contains(key, "/../") || strings.HasSuffix(key, "/..") || strings.Split(key, "/")[0] == tmpName {
			t.Fatalf("ValidateKey accepted %q", key)
		}
		if strings.Count(key, "/") > 16 || strings.Count(prefix, "/") > 16 {
			return // the store fsyncs every directory it makes: deep keys only slow the fuzzer down
		}
		_, perr := l.Put(ctx, key, strings.NewReader("data"))
		switch {
		case kerr != nil && !errors.Is(perr, errdefs.ErrInvalid):
			t.Fatalf("Put(%q) of an invalid key: %v", key, perr)
		case kerr == nil && perr == nil:
			if o, err := l.Stat(ctx, key); err != nil || o.Size != 4 || o.Key != key {
				t.Fatalf("Stat(%q) = %+v, %v", key, o, err)
			}
			rc, err := l.Get(ctx, key)
			if err != nil {
				t.Fatalf("Get(%q): %v", key, err)
			}
			b, _ := io.ReadAll(rc)
			rc.Close()
			if string(b) != "data" {
				t.Fatalf("Get(%q) = %q", key, b)
			}
		}
		if kerr != nil {
			if _, err := l.Get(ctx, key); !errors.Is(err, errdefs.ErrInvalid) {
				t.Fatalf("Get(%q) of an invalid key: %v", key, err)
			}
		}
		before, err := l.List(ctx, "")
		if err != nil {
			t.Fatal(err)
		}
		if derr := l.Delete(ctx, prefix); derr == nil {
			after, err := l.List(ctx, "")
			if err != nil {
				t.Fatal(err)
			}
			left := map[string]bool{}
			for _, o := range after {
				left[o.Key] = true
			}
			for _, o := range before {
				if strings.HasPrefix(o.Key, prefix) == left[o.Key] {
					t.Fatalf("Delete(%q): %q is left: %v (before %v)", prefix, o.Key, left[o.Key], before)
				}
			}
		} else if !errors.Is(derr, errdefs.ErrInvalid) {
			t.Fatalf("Delete(%q): %v", prefix, derr)
		}
		// Nothing outside the store's directory, nothing but its three subdirectories in it.
		if ents, _ := os.ReadDir(base); len(ents) != 1 {
			t.Fatalf("the store wrote beside its directory: %v", ents)
		}
		filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
			rel, _ := filepath.Rel(dir, p)
			top := strings.Split(rel, "/")[0]
			if rel != "." && top != objectsDir && top != tmpDir && top != sidecarDir {
				t.Errorf("the store made %s", p)
			}
			return nil
		})
		if key != "keep/me" && !strings.HasPrefix("keep/me", prefix) {
			rc, err := l.Get(ctx, "keep/me")
			if err != nil {
				t.Fatalf("an unrelated object went: %v", err)
			}
			b, _ := io.ReadAll(rc)
			rc.Close()
			if !bytes.Equal(b, []byte("kept")) {
				t.Fatalf("an unrelated object changed: %q", b)
			}
		}
	})
}
