package testserver

import (
	"archive/zip"
	"bytes"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"html"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// SharedImageDir is the images directory holding the shared default test image (RAMIFY_TEST_IMAGE_DIR).
func SharedImageDir() string {
	if d := os.Getenv("RAMIFY_TEST_IMAGE_DIR"); d != "" {
		return d
	}
	return "/var/cache/ramify/images"
}

// ImageDir returns a fresh images directory for a test that builds images: its "default" is a symlink to the
// shared default image, so named images are built on it (and into the fresh directory) without rebuilding or
// touching it. The directory and its parents are searchable by the sandboxes' uid, as builds need. It skips
// when there is no shared image.
func ImageDir(t testing.TB) string {
	shared := SharedImageDir()
	if _, err := os.Stat(filepath.Join(shared, "default", "manifest.json")); err != nil {
		t.Skipf("no test image in %s: run 'make image'", shared)
	}
	dir := t.TempDir()
	for d := dir; d != "/" && d != os.TempDir(); d = filepath.Dir(d) {
		if err := os.Chmod(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.Symlink(filepath.Join(shared, "default"), filepath.Join(dir, "default")); err != nil {
		t.Fatal(err)
	}
	return dir
}

// PyPackage is a pure-Python distribution for ServePyIndex: a wheel of one module.
type PyPackage struct {
	Name, Version string
	Module        string // module file name without .py
	Source        string // the module's code
}

// ServePyIndex serves a PEP 503 simple package index on loopback holding one wheel per package (written here,
// no pip involved) and returns its URL (".../simple/"). It stops when the test ends.
func ServePyIndex(t testing.TB, pkgs ...PyPackage) string {
	files := map[string][]byte{}
	projects := map[string]string{} // normalised name -> anchor list
	for _, p := range pkgs {
		name, whl := wheel(t, p)
		files[name] = whl
		sum := sha256.Sum256(whl)
		norm := strings.ToLower(strings.NewReplacer("_", "-", ".", "-").Replace(p.Name))
		projects[norm] += fmt.Sprintf("<a href=\"/files/%s#sha256=%s\">%s</a>\n", name, hex.EncodeToString(sum[:]), html.EscapeString(name))
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /simple/{$}", func(w http.ResponseWriter, r *http.Request) {
		for n := range projects {
			fmt.Fprintf(w, "<a href=\"/simple/%s/\">%s</a>\n", n, n)
		}
	})
	mux.HandleFunc("GET /simple/{project}/{$}", func(w http.ResponseWriter, r *http.Request) {
		links, ok := projects[r.PathValue("project")]
		if !ok {
			http.NotFound(w, r)
			return
		}
		fmt.Fprintf(w, "<!DOCTYPE html><html><body>\n%s</body></html>\n", links)
	})
	mux.HandleFunc("GET /files/{name}", func(w http.ResponseWriter, r *http.Request) {
		b, ok := files[r.PathValue("name")]
		if !ok {
			http.NotFound(w, r)
			return
		}
		w.Write(b) //nolint:errcheck
	})
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: mux}
	go srv.Serve(ln) //nolint:errcheck // ends with Close
	t.Cleanup(func() { srv.Close() })
	return "http://" + ln.Addr().String() + "/simple/"
}

// wheel builds p's wheel (PEP 427): the module, METADATA, WHEEL and a RECORD with every file's hash.
func wheel(t testing.TB, p PyPackage) (string, []byte) {
	dist := strings.NewReplacer("-", "_", ".", "_").Replace(p.Name)
	info := fmt.Sprintf("%s-%s.dist-info", dist, p.Version)
	entries := []struct{ name, body string }{
		{p.Module + ".py", p.Source},
		{info + "/METADATA", fmt.Sprintf("Metadata-Version: 2.1\nName: %s\nVersion: %s\n", p.Name, p.Version)},
		{info + "/WHEEL", "Wheel-Version: 1.0\nGenerator: ramify-test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"},
	}
	var buf bytes.Buffer
	zw := zip.NewWriter(&buf)
	var record strings.Builder
	for _, e := range entries {
		w, err := zw.Create(e.name)
		if err != nil {
			t.Fatal(err)
		}
		w.Write([]byte(e.body)) //nolint:errcheck // a bytes.Buffer
		sum := sha256.Sum256([]byte(e.body))
		fmt.Fprintf(&record, "%s,sha256=%s,%d\n", e.name, base64.RawURLEncoding.EncodeToString(sum[:]), len(e.body))
	}
	fmt.Fprintf(&record, "%s/RECORD,,\n", info)
	w, err := zw.Create(info + "/RECORD")
	if err != nil {
		t.Fatal(err)
	}
	w.Write([]byte(record.String())) //nolint:errcheck
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("%s-%s-py3-none-any.whl", dist, p.Version), buf.Bytes()
}
