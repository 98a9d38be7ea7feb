package sandbox

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"io"
	"strings"
	"testing"

	"github.com/ramify-dev/ramify/internal/runtime/fake"
	"github.com/ramify-dev/ramify/internal/snapstore"
)

// cutStore is a snapshot store whose reads fail after cut bytes, as a transfer from a store that went away does.
type cutStore struct {
	*fake.Snapshots
	cut int
}

var errCut = errors.New("connection reset by peer")

func (c cutStore) Get(ctx context.Context, key string) (io.ReadCloser, error) {
	rc, err := c.Snapshots.Get(ctx, key)
	if err != nil {
		return nil, err
	}
	return io.NopCloser(io.MultiReader(io.LimitReader(rc, int64(c.cut)), iotestErr{errCut})), nil
}

type iotestErr struct{ err error }

func (e iotestErr) Read([]byte) (int, error) { return 0, e.err }

// TestCutTransferIsNotCorrupt: a part whose transfer is cut off says it could not be read and that the snapshot
// is kept, not that the snapshot is corrupt (which would have a user delete a good snapshot); a part whose bytes
// differ from the manifest still says corrupt.
func TestCutTransferIsNotCorrupt(t *testing.T) {
	var tb bytes.Buffer
	tw := tar.NewWriter(&tb)
	data := bytes.Repeat([]byte("x"), 1<<20)
	tw.WriteHeader(&tar.Header{Name: "root/big", Mode: 0o644, Size: int64(len(data)), Typeflag: tar.TypeReg}) //nolint:errcheck
	tw.Write(data)                                                                                            //nolint:errcheck
	tw.Close()                                                                                                //nolint:errcheck
	sum := sha256.Sum256(tb.Bytes())
	m := Manifest{Parts: map[string]Part{"layer.tar": {Size: int64(tb.Len()), Sum: snapstore.Sum{SHA256: hex.EncodeToString(sum[:])}}}}
	snaps := fake.NewSnapshots()
	if _, err := snaps.Put(context.Background(), "p/layer.tar", bytes.NewReader(tb.Bytes())); err != nil {
		t.Fatal(err)
	}
	s := &Service{cfg: Config{Snapshots: cutStore{snaps, 300 << 10}}}
	err := s.extractPart(context.Background(), "p/", "layer.tar", m, t.TempDir())
	if !errors.Is(err, errCut) || strings.Contains(err.Error(), "corrupt") || !strings.Contains(err.Error(), "kept") {
		t.Fatalf("a cut transfer: %v; want the read's error, saying the snapshot is kept", err)
	}
	m.Parts["layer.tar"] = Part{Size: int64(tb.Len()), Sum: snapstore.Sum{CRC32C: "00000000"}}
	s.cfg.Snapshots = snaps
	if err := s.extractPart(context.Background(), "p/", "layer.tar", m, t.TempDir()); err == nil || !strings.Contains(err.Error(), "corrupt") {
		t.Fatalf("a part unlike its manifest: %v, want corrupt", err)
	}
}
