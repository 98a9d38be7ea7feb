package namespaces

import "path/filepath"

// A zygote's interpreter (see zygote.go) started in a sandbox of the default image alone. A sandbox whose own
// files (a resume's or a template's layer) would change what Python does as it starts, or what an import of a
// package the zygote imported ahead loads, must not be given it: its files are looked at on the host, in its
// layer's upper directory, before the zygote is forked.

// startupPatterns match files in a layer's upper directory that an interpreter reads as it starts: .pth files
// and sitecustomize/usercustomize modules in the site directories (editable installs and namespace packages
// add .pth files), the user site directory (`pip install --user`: on sys.path only if it exists at the start;
// the image has none), the standard library's own modules (site.py among them) or Debian's /etc/python3.x,
// the dynamic loader's preload list, and the time zone (read once, when TZ is not set).
var startupPatterns = []string{
	"usr/lib/python3.*/*.py", "etc/python3*/*", "etc/ld.so.preload", "etc/localtime",
	"usr/lib/python3*/*-packages/*.pth", "usr/lib/python3*/*-packages/*customize.py",
	"usr/local/lib/python3*/*-packages/*.pth", "usr/local/lib/python3*/*-packages/*customize.py",
	"root/.local/lib/python3*/site-packages",
}

// preloadPatterns match, per package a zygote imports ahead, files of a layer's upper directory that may change
// what importing it loads: the package's own files, a module or package of its name in a directory before it on
// sys.path (the standard library's, its zip, its lib-dynload; a site directory), and for numpy its BLAS and
// LAPACK (the shared libraries, Debian's alternatives that choose them, the dynamic loader's configuration). The
// interpreter itself checks its import-time variables and its working directory (repl.py _preload_holds).
var preloadPatterns = map[string][]string{
	"numpy": {
		"usr/lib/python3*/*-packages/numpy*", "usr/local/lib/python3*/*-packages/numpy*",
		"root/.local/lib/python3*/site-packages/numpy*",
		"usr/lib/python3*.zip", "usr/lib/python3.*/numpy*", "usr/lib/python3.*/lib-dynload/numpy*",
		"usr/lib/x86_64-linux-gnu/*", "usr/lib/aarch64-linux-gnu/*", "usr/local/lib/*.so*", "lib", "lib64",
		"etc/alternatives/*", "etc/ld.so.*",
	},
}

// layerChanges reports whether upper (a layer's upper directory) holds a file matching one of patterns.
func layerChanges(upper string, patterns []string) bool {
	for _, p := range patterns {
		if m, _ := filepath.Glob(filepath.Join(upper, p)); len(m) > 0 {
			return true
		}
	}
	return false
}
