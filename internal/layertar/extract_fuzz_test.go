package layertar

import (
	"archive/tar"
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"
)

// FuzzExtractEntries complements FuzzExtract (raw bytes, which mostly exercise the tar reader) with well-formed
// layers built from a small script, so that the fuzzer explores sequences of entries: replacements, symlinks
// and hard links on the way, whiteouts, directories merged and removed. Besides "nothing outside the
// destination changes" (sandboxDirs) it checks that a layer Extract accepts is applied: the last entry on a
// path decides what is there, unless a later entry replaced a directory above it.

type layerEntry struct {
	typ        byte
	name, link string
	body       string
	mode       int64
}

// parseLayerScript reads one entry per line: "<type><name>|<link>|<body>|<octal mode>" with the tar type flag
// byte ('0' file, '5' dir, '2' symlink, '1' hard link, '3' whiteout (char 0:0), '6' fifo, ...). "OUT" in a
// name or link stands for the directory next to the destination.
func parseLayerScript(s, out string) []layerEntry {
	var entries []layerEntry
	for _, line := range strings.Split(s, "\n") {
		if line == "" || len(entries) >= 32 {
			continue
		}
		f := strings.SplitN(line[1:], "|", 4)
		for len(f) < 4 {
			f = append(f, "")
		}
		mode, err := strconv.ParseInt(f[3], 8, 64)
		if err != nil || mode < 0 || mode > 0o7777 {
			mode = 0o644
		}
		entries = append(entries, layerEntry{typ: line[0], name: strings.ReplaceAll(f[0], "OUT", out),
			link: strings.ReplaceAll(f[1], "OUT", out), body: f[2], mode: mode})
	}
	return entries
}

func buildLayer(entries []layerEntry) ([]byte, bool) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		h := &tar.Header{Typeflag: e.typ, Name: e.name, Linkname: e.link, Mode: e.mode,
			ModTime: time.Unix(1700000000, 5), Format: tar.FormatPAX}
		if e.typ == tar.TypeReg {
			h.Size = int64(len(e.body))
		}
		if tw.WriteHeader(h) != nil {
			return nil, false
		}
		if h.Size > 0 {
			tw.Write([]byte(e.body))
		}
	}
	return buf.Bytes(), tw.Close() == nil
}

var layerScripts = []string{
	"5./||755\n5root/||700\n0root/a||hello|600\n2root/l|../../../etc/passwd\n1root/h|root/a\n3root/wh\n6root/fifo",
	"2l|OUT\n0l/secret||pwned",
	"2l|/\n0l/tmp/escaped||pwned",
	"0../x||pwned",
	"1h|OUT/secret",
	"2l|OUT/secret\n1h|l\n0h||replaced",
	"5a/\n0a/b||b\n0a||file now\n5a/\n0a/c||c",
	"0a/b/c||deep\n2a|x\n5a/",
	"0pre/x||through the planted link",
	"5pre/\n0pre/x||pre replaced by a dir",
	"0f||one\n1g|f\n0f||two",
	"3w\n0w||file over whiteout\n3w",
	"5d/||0\n0d/x||x",
	"0.||root as a file",
	"0a||x|4755\n5b/||1777",
}

func FuzzExtractEntries(f *testing.F) {
	requireRoot(f)
	for _, s := range layerScripts {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, script string) {
		dst, outside, check := sandboxDirs(t)
		must(t, os.Symlink(outside, filepath.Join(dst, "pre")))
		entries := parseLayerScript(script, outside)
		// Scripts carry no device numbers: character and block entries are 0:0 (whiteouts), never host devices.
		data, ok := buildLayer(entries)
		if !ok {
			return
		}
		_, err := Extract(bytes.NewReader(data), dst)
		check()
		if err != nil {
			return
		}
		checkLayerApplied(t, dst, entries)
	})
}

func checkLayerApplied(t *testing.T, dst string, entries []layerEntry) {
	rels := make([]string, len(entries))
	for i, e := range entries {
		rels[i], _ = cleanName(e.name)
	}
	for i, e := range entries {
		rel := rels[i]
		if rel == "" {
			continue
		}
		live := true
		for j := i + 1; j < len(entries); j++ {
			if rels[j] == rel || (rels[j] != "" && strings.HasPrefix(rel, rels[j]+"/") && entries[j].typ != tar.TypeDir) {
				live = false // replaced, or a directory above it was
			}
		}
		// A hard link entry replaces its target's path only if it names itself: links are checked by the
		// target's entry.
		if !live || e.typ == tar.TypeLink {
			continue
		}
		p := filepath.Join(dst, rel)
		var st unix.Stat_t
		if err := unix.Lstat(p, &st); err != nil {
			t.Errorf("entry %q extracted without error but %s is missing: %v", e.name, p, err)
			continue
		}
		typ := st.Mode & unix.S_IFMT
		switch e.typ {
		case tar.TypeReg:
			b, err := os.ReadFile(p)
			if typ != unix.S_IFREG || err != nil || string(b) != e.body {
				t.Errorf("entry %q: %s holds %.64q (type %o, %v), want %.64q", e.name, p, b, typ, err, e.body)
			} else if st.Mode&07777 != uint32(e.mode) {
				t.Errorf("entry %q: mode %o, want %o", e.name, st.Mode&07777, e.mode)
			}
		case tar.TypeDir:
			if typ != unix.S_IFDIR {
				t.Errorf("entry %q: %s is not a directory (type %o)", e.name, p, typ)
			}
		case tar.TypeSymlink:
			if target, err := os.Readlink(p); typ != unix.S_IFLNK || err != nil || target != e.link {
				t.Errorf("entry %q: %s links to %q (type %o, %v), want %q", e.name, p, target, typ, err, e.link)
			}
		case tar.TypeChar:
			if typ != unix.S_IFCHR || st.Rdev != 0 {
				t.Errorf("entry %q: %s is not a whiteout (type %o, rdev %d)", e.name, p, typ, st.Rdev)
			}
		case tar.TypeFifo:
			if typ != unix.S_IFIFO {
				t.Errorf("entry %q: %s is not a fifo (type %o)", e.name, p, typ)
			}
		}
	}
}
