// Package rawname is the API's lossless form of sandbox file names, which are bytes, in JSON, whose strings are
// Unicode: shared by the server (internal/files, internal/fsdiff, internal/api) and the Go client.
package rawname

import (
	"encoding/base64"
	"fmt"
	"strings"
	"unicode/utf8"
)

// Names of sandbox files are bytes (Linux allows any but "/" and NUL); JSON strings are Unicode. The API's one
// convention for a field X that carries a sandbox path or name:
//
//   - raw bytes that are valid UTF-8: X is that string, and there is no X_b64 (the common case, unchanged);
//   - any other: X is a display form (each byte that is not part of valid UTF-8 replaced with U+FFFD, which
//     may equal another file's name and must never be sent back), and X_b64 beside it is the standard base64
//     (RFC 4648, padded) of the raw bytes: the one lossless form.
//
// A list of paths ("added") gets, when any of its paths is not UTF-8, a parallel list ("added_b64") of the same
// length: base64 where the path needs it, null elsewhere. Where a request takes a path X (query or body), X_b64
// is accepted in its place.

// Encode returns the JSON fields for the raw name s: the string itself and "" when s is valid UTF-8, else
// the display form and the base64 of s.
func Encode(s string) (display, b64 string) {
	if utf8.ValidString(s) {
		return s, ""
	}
	return Display(s), base64.StdEncoding.EncodeToString([]byte(s))
}

// Display is s with each byte that is not part of valid UTF-8 replaced with U+FFFD (what encoding/json does
// to such a string): for showing, never for naming a file.
func Display(s string) string {
	if utf8.ValidString(s) {
		return s
	}
	var b strings.Builder
	b.Grow(len(s) + 8)
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && n == 1 {
			b.WriteRune(utf8.RuneError)
		} else {
			b.WriteString(s[i : i+n])
		}
		i += n
	}
	return b.String()
}

// Decode is the raw name that a display string and its base64 (empty when there is none) stand for: the
// inverse of Encode.
func Decode(display, b64 string) (string, error) {
	if b64 == "" {
		return display, nil
	}
	b, err := base64.StdEncoding.DecodeString(b64)
	if err != nil {
		return "", err
	}
	return string(b), nil
}

// EncodeList returns the parallel base64 list for paths: nil when every path is valid UTF-8, else one element
// per path, the base64 of a path that is not valid UTF-8 and nil for one that is. The paths themselves are to be
// sent through Display.
func EncodeList(paths []string) (display []string, b64 []*string) {
	display = paths
	for i, p := range paths {
		if utf8.ValidString(p) {
			continue
		}
		if b64 == nil {
			b64 = make([]*string, len(paths))
			display = append([]string(nil), paths...)
		}
		d, e := Encode(p)
		display[i], b64[i] = d, &e
	}
	return display, b64
}

// DecodeList is the inverse of EncodeList: the raw paths of display and its parallel base64 list (nil: none).
func DecodeList(display []string, b64 []*string) ([]string, error) {
	if b64 == nil {
		return display, nil
	}
	if len(b64) != len(display) {
		return nil, fmt.Errorf("%d paths but %d base64 elements", len(display), len(b64))
	}
	out := make([]string, len(display))
	for i, p := range display {
		out[i] = p
		if b64[i] != nil {
			raw, err := Decode(p, *b64[i])
			if err != nil {
				return nil, err
			}
			out[i] = raw
		}
	}
	return out, nil
}

// Names is the wire form of a listing entry's name and path (each with its _b64 twin when it needs one); the
// server's and the client's entries embed it.
type Names struct {
	Name    string `json:"name"`
	NameB64 string `json:"name_b64,omitempty"`
	Path    string `json:"path"`
	PathB64 string `json:"path_b64,omitempty"`
}

// EncodeNames is the wire form of the raw name and path.
func EncodeNames(name, path string) Names {
	var n Names
	n.Name, n.NameB64 = Encode(name)
	n.Path, n.PathB64 = Encode(path)
	return n
}

// Decode returns the raw name and path.
func (n Names) Decode() (name, path string, err error) {
	if name, err = Decode(n.Name, n.NameB64); err != nil {
		return "", "", fmt.Errorf("name_b64: %w", err)
	}
	if path, err = Decode(n.Path, n.PathB64); err != nil {
		return "", "", fmt.Errorf("path_b64: %w", err)
	}
	return name, path, nil
}

// Lists is the wire form of a diff: its three lists of paths, each with its _b64 twin when a path needs one
// (EncodeList), and whether it was cut short. The server's and the client's diffs are read and written through it.
type Lists struct {
	Added       []string  `json:"added"`
	AddedB64    []*string `json:"added_b64,omitempty"`
	Removed     []string  `json:"removed"`
	RemovedB64  []*string `json:"removed_b64,omitempty"`
	Modified    []string  `json:"modified"`
	ModifiedB64 []*string `json:"modified_b64,omitempty"`
	Truncated   bool      `json:"truncated,omitempty"`
}

// EncodeLists is the wire form of a diff's raw lists.
func EncodeLists(added, removed, modified []string, truncated bool) Lists {
	l := Lists{Truncated: truncated}
	l.Added, l.AddedB64 = EncodeList(added)
	l.Removed, l.RemovedB64 = EncodeList(removed)
	l.Modified, l.ModifiedB64 = EncodeList(modified)
	return l
}

// Decode returns the diff's raw lists.
func (l Lists) Decode() (added, removed, modified []string, err error) {
	if added, err = DecodeList(l.Added, l.AddedB64); err != nil {
		return nil, nil, nil, fmt.Errorf("added_b64: %w", err)
	}
	if removed, err = DecodeList(l.Removed, l.RemovedB64); err != nil {
		return nil, nil, nil, fmt.Errorf("removed_b64: %w", err)
	}
	if modified, err = DecodeList(l.Modified, l.ModifiedB64); err != nil {
		return nil, nil, nil, fmt.Errorf("modified_b64: %w", err)
	}
	return added, removed, modified, nil
}
