package sandbox

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ramify-dev/ramify/internal/errdefs"
	"github.com/ramify-dev/ramify/internal/snapstore"
)

// A resume trusts nothing of a snapshot it reads back from the store (a directory anyone with host access can
// write, or an S3 bucket): FuzzSnapshotManifest gives readManifest arbitrary manifest.json bytes and, when it
// accepts them, extractPart an arbitrary layer.tar. A corrupt manifest must be an errdefs.ErrInvalid error (never
// a panic), an accepted one has version 1, a layer is accepted only if its size and SHA-256 are the manifest's,
// a mismatch is ErrInvalid, and nothing is ever written outside the directory the layer is extracted into.

// memSnapshots is a snapshot store in memory; only Get is used.
type memSnapshots struct {
	snapstore.Store
	objs map[string][]byte
}

func (m *memSnapshots) Get(ctx context.Context, key string) (io.ReadCloser, error) {
	b, ok := m.objs[key]
	if !ok {
		return nil, fmt.Errorf("get %s: %w", key, errdefs.ErrNotFound)
	}
	return io.NopCloser(bytes.NewReader(b)), nil
}

// fuzzLayer is a small layer as pause writes it: the root's attributes, a file, a directory, a symlink, a hard
// link and an overlay whiteout.
func fuzzLayer() []byte {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	mt := time.Unix(1700000000, 0)
	for _, h := range []*tar.Header{
		{Typeflag: tar.TypeDir, Name: "./", Mode: 0o755, ModTime: mt},
		{Typeflag: tar.TypeReg, Name: "root/a.txt", Mode: 0o644, Size: 5, ModTime: mt, Uid: 100000, Gid: 100000},
		{Typeflag: tar.TypeDir, Name: "root/d/", Mode: 0o700, ModTime: mt},
		{Typeflag: tar.TypeSymlink, Name: "root/d/l", Linkname: "../../../../etc/passwd", ModTime: mt},
		{Typeflag: tar.TypeLink, Name: "root/h", Linkname: "root/a.txt", ModTime: mt},
		{Typeflag: tar.TypeChar, Name: "root/gone", Mode: 0, ModTime: mt},
	} {
		tw.WriteHeader(h)
		if h.Size > 0 {
			tw.Write([]byte("hello"))
		}
	}
	tw.Close()
	return buf.Bytes()
}

// manifestFor is a manifest whose layer.tar is layer, with its CRC-32C, or (older) its SHA-256.
func manifestFor(layer []byte, older bool) []byte {
	part := func(b []byte) Part {
		if older {
			sum := sha256.Sum256(b)
			return Part{Size: int64(len(b)), Sum: snapstore.Sum{SHA256: hex.EncodeToString(sum[:])}}
		}
		h := snapstore.NewCRC32C()
		h.Write(b)
		return Part{Size: int64(len(b)), Sum: snapstore.Sum{}.Of(h)}
	}
	b, _ := json.Marshal(Manifest{Version: 1, Sandbox: "sbx_" + strings.Repeat("a", 32), CreatedAt: time.Unix(1700000000, 0).UTC(),
		Spec: json.RawMessage(`{"vcpu":1}`), Parts: map[string]Part{"layer.tar": part(layer), "session.bin": part(nil)}})
	return b
}

// realDevices reports whether layer has a device entry other than a whiteout (0:0): the target does not make
// host device nodes, even in a temporary directory.
func realDevices(layer []byte) bool {
	tr := tar.NewReader(bytes.NewReader(layer))
	for {
		h, err := tr.Next()
		if err != nil {
			return false
		}
		if (h.Typeflag == tar.TypeChar || h.Typeflag == tar.TypeBlock) && (h.Devmajor != 0 || h.Devminor != 0) {
			return true
		}
	}
}

func FuzzSnapshotManifest(f *testing.F) {
	layer := fuzzLayer()
	for _, older := range []bool{false, true} {
		good := manifestFor(layer, older)
		f.Add(good, layer)
		f.Add(good, layer[:len(layer)-700])
		f.Add(good, append(append([]byte(nil), layer...), 0))
		f.Add(manifestFor(nil, older), []byte{})
	}
	for _, m := range []string{
		``, `{}`, `null`, `{"version":2}`, `{"version":1}`, `{"version":1,"parts":null}`, `{"version":"1"}`,
		`{"version":1,"parts":{"layer.tar":{"size":-1,"sha256":"zz"}}}`, `{"version":1,"parts":{"layer.tar":{}}}`,
		`{"version":1,"parts":{"layer.tar":{"size":0,"crc32c":"00000000","sha256":"e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"}}}`,
		`{"version":1,"not_saved":[{"name":"x"}],"extra":{"a":1e308}}`, `[1]`, `{"version":1e400}`,
		`{"version":1,"parts":{"../../layer.tar":{"size":1}}}`, "\xef\xbb\xbf{}", strings.Repeat(`{"a":`, 10000),
	} {
		f.Add([]byte(m), layer)
	}
	f.Fuzz(func(t *testing.T, manifest, layer []byte) {
		st := &memSnapshots{objs: map[string][]byte{"snap/manifest.json": manifest, "snap/layer.tar": layer}}
		s := &Service{cfg: Config{Snapshots: st}, log: slog.New(slog.DiscardHandler)}
		ctx := context.Background()
		m, err := s.readManifest(ctx, "snap/")
		if err != nil {
			if !errors.Is(err, errdefs.ErrInvalid) {
				t.Fatalf("corrupt manifest: %v, want ErrInvalid", err)
			}
			return
		}
		if m.Version != 1 {
			t.Fatalf("accepted a manifest of version %d", m.Version)
		}
		if os.Geteuid() != 0 || realDevices(layer) {
			return // extraction chowns (root only) and makes device nodes
		}
		base := t.TempDir()
		dir := filepath.Join(base, "upper")
		outside := filepath.Join(base, "outside")
		for _, d := range []string{dir, outside} {
			if err := os.Mkdir(d, 0o755); err != nil {
				t.Fatal(err)
			}
		}
		if err := os.WriteFile(filepath.Join(outside, "secret"), []byte("host"), 0o600); err != nil {
			t.Fatal(err)
		}
		err = s.extractPart(ctx, "snap/", "layer.tar", m, dir)
		want, listed := m.Parts["layer.tar"]
		sum := sha256.Sum256(layer)
		crc := snapstore.NewCRC32C()
		crc.Write(layer)
		matches := listed && want.Size == int64(len(layer)) &&
			(want.Sum == snapstore.Sum{SHA256: hex.EncodeToString(sum[:])} || want.Sum == snapstore.Sum{}.Of(crc))
		if err == nil && !matches {
			t.Fatalf("accepted a layer of %d bytes that the manifest does not describe (%+v)", len(layer), want)
		}
		if err != nil && !matches && !errors.Is(err, errdefs.ErrInvalid) {
			t.Fatalf("a layer the manifest does not describe: %v, want ErrInvalid", err)
		}
		ents, _ := os.ReadDir(base)
		if len(ents) != 2 {
			t.Fatalf("extraction wrote next to its directory: %v", ents)
		}
		if ents, _ := os.ReadDir(outside); len(ents) != 1 {
			t.Fatalf("extraction wrote into a neighbour directory: %v", ents)
		}
		if b, err := os.ReadFile(filepath.Join(outside, "secret")); err != nil || string(b) != "host" {
			t.Fatalf("neighbour file changed: %q %v", b, err)
		}
	})
}
