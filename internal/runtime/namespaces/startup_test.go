package namespaces

import (
	"os"
	"path/filepath"
	"testing"
)

// TestLayerChanges: the files of a sandbox's layer that keep it from a zygote's interpreter (startupPatterns) or
// from one that imported numpy ahead (preloadPatterns), and files that do not.
func TestLayerChanges(t *testing.T) {
	for _, c := range []struct {
		file             string
		startup, preload bool
	}{
		{"root/notes.txt", false, false},
		{"usr/lib/python3/dist-packages/mylib.py", false, false},
		{"usr/lib/python3/dist-packages/numpy/core/__init__.py", false, true},
		{"usr/local/lib/python3.11/dist-packages/numpy/__init__.py", false, true},
		{"root/.local/lib/python3.11/site-packages/numpy/__init__.py", true, true},
		// A module or package of numpy's name before dist-packages on sys.path shadows it.
		{"usr/lib/python3.11/numpy/__init__.py", false, true},
		{"usr/lib/python3.11/numpy.py", true, true},
		{"usr/lib/python311.zip", false, true},
		{"usr/lib/python3.11/lib-dynload/numpy.cpython-311-x86_64-linux-gnu.so", false, true},
		{"usr/lib/x86_64-linux-gnu/libopenblas.so.0", false, true},
		{"etc/alternatives/libblas.so.3-x86_64-linux-gnu", false, true},
		{"usr/lib/python3/dist-packages/editable.pth", true, false},
		{"usr/lib/python3.11/sitecustomize.py", true, false},
		{"etc/localtime", true, false},
	} {
		upper := t.TempDir()
		p := filepath.Join(upper, c.file)
		if err := os.MkdirAll(filepath.Dir(p), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(p, nil, 0o644); err != nil {
			t.Fatal(err)
		}
		if got := layerChanges(upper, startupPatterns); got != c.startup {
			t.Errorf("%s: changes the interpreter's start = %v, want %v", c.file, got, c.startup)
		}
		if got := layerChanges(upper, preloadPatterns["numpy"]); got != c.preload {
			t.Errorf("%s: changes numpy's import = %v, want %v", c.file, got, c.preload)
		}
	}
}
