package files

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/ramify-dev/ramify/internal/errdefs"
	"github.com/ramify-dev/ramify/internal/rawname"
)

// FuzzNameRoundTrip: any raw name survives EncodeName/DecodeName and a JSON trip through an Entry; a valid UTF-8
// name travels as itself with no base64; two different names never give the same wire form; the display form
// is valid UTF-8 and one rune per invalid byte.
func FuzzNameRoundTrip(f *testing.F) {
	for _, s := range []string{"", "a.txt", "caf\xe9", "caf\xc3\xa9", "\x1b[31mred", "bad\xff\xfe!", "caf\ufffd", "\xc3", "\xed\xa0\x80", "<img src=x>"} {
		f.Add(s, "caf\xe9")
	}
	f.Fuzz(func(t *testing.T, s, other string) {
		d, b := rawname.Encode(s)
		if !utf8.ValidString(d) {
			t.Fatalf("rawname.Encode(%q): display %q is not UTF-8", s, d)
		}
		if utf8.ValidString(s) != (b == "") || (b == "" && d != s) {
			t.Fatalf("rawname.Encode(%q) = %q, %q", s, d, b)
		}
		if utf8.RuneCountInString(d) != utf8.RuneCountInString(s) {
			t.Fatalf("rawname.Encode(%q): display %q has not one rune per rune or invalid byte", s, d)
		}
		raw, err := rawname.Decode(d, b)
		if err != nil || raw != s {
			t.Fatalf("rawname.Decode(rawname.Encode(%q)) = %q, %v", s, raw, err)
		}
		od, ob := rawname.Encode(other)
		if s != other && od == d && ob == b {
			t.Fatalf("%q and %q both encode as %q, %q", s, other, d, b)
		}
		// Through JSON, as the API sends it and a client reads it.
		e := Entry{Name: s, Path: "/root/" + s, LinkTarget: other, Type: "file", Mode: "0644", MTime: time.Unix(1, 0).UTC()}
		j, err := json.Marshal(e)
		if err != nil {
			t.Fatal(err)
		}
		if !utf8.Valid(j) {
			t.Fatalf("entry JSON is not UTF-8: %q", j)
		}
		var back Entry
		if err := json.Unmarshal(j, &back); err != nil || back != e {
			t.Fatalf("entry %+v came back as %+v (%v) via %s", e, back, err, j)
		}
		// A list of paths with its parallel base64 list.
		paths := []string{s, other, "/plain"}
		pd, pb := rawname.EncodeList(paths)
		if pb != nil && len(pb) != len(paths) {
			t.Fatalf("rawname.EncodeList(%q): %d base64 elements", paths, len(pb))
		}
		if got, err := rawname.DecodeList(pd, pb); err != nil || !slices.Equal(got, paths) {
			t.Fatalf("rawname.DecodeList(rawname.EncodeList(%q)) = %q, %v", paths, got, err)
		}
		// As a request gives it: path_b64 of the bytes is the same path as path itself.
		p, ok, err := PathParam("path", "", false, base64.StdEncoding.EncodeToString([]byte(s)), true)
		if err != nil || !ok || p != s {
			t.Fatalf("PathParam(b64 of %q) = %q, %v, %v", s, p, ok, err)
		}
		if _, _, err := PathParam("path", s, true, b, true); !errors.Is(err, errdefs.ErrInvalid) {
			t.Fatalf("PathParam with both forms: %v", err)
		}
		// Arbitrary input as path_b64: decoded or refused with ErrInvalid, never anything else.
		if _, _, err := PathParam("path", "", false, s, true); err != nil && (!errors.Is(err, errdefs.ErrInvalid) || !strings.Contains(err.Error(), "path_b64")) {
			t.Fatalf("PathParam(%q): %v", s, err)
		}
	})
}
