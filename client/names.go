package client

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/url"
	"time"
	"unicode/utf8"
)

// File names in a sandbox are bytes, and a Go string holds any bytes: every path this package takes is sent
// as its bytes, and every name or path it returns (Entry.Name, Entry.Path, Entry.LinkTarget, the lists of a
// Diff) is the file's raw name, also when it is not valid UTF-8. On the wire such a name travels as a display
// string with its standard base64 beside it ("path" and "path_b64", see the API's docs); this package reads and
// writes that form.

// encodeName is the wire form of the raw name s: s and "" when s is valid UTF-8, else a display form (U+FFFD for
// each byte that is not UTF-8) and the base64 of s.
func encodeName(s string) (display, b64 string) {
	if utf8.ValidString(s) {
		return s, ""
	}
	var d []rune
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRuneInString(s[i:])
		d = append(d, r) // utf8.RuneError for a byte that is not UTF-8
		i += n
	}
	return string(d), base64.StdEncoding.EncodeToString([]byte(s))
}

// decodeName is the raw name of a display string and its base64 ("" when none).
func decodeName(display, b64 string) (string, error) {
	if b64 == "" {
		return display, nil
	}
	b, err := base64.StdEncoding.DecodeString(b64)
	if err != nil {
		return "", err
	}
	return string(b), nil
}

// pathQuery is the query naming path: path, or path_b64 when path is not valid UTF-8.
func pathQuery(path string) url.Values {
	if _, b := encodeName(path); b != "" {
		return url.Values{"path_b64": {b}}
	}
	return url.Values{"path": {path}}
}

type entryJSON struct {
	Name          string    `json:"name"`
	NameB64       string    `json:"name_b64,omitempty"`
	Path          string    `json:"path"`
	PathB64       string    `json:"path_b64,omitempty"`
	Type          string    `json:"type"`
	Size          int64     `json:"size"`
	Mode          string    `json:"mode"`
	Mtime         time.Time `json:"mtime"`
	LinkTarget    string    `json:"link_target,omitempty"`
	LinkTargetB64 string    `json:"link_target_b64,omitempty"`
}

// UnmarshalJSON reads an entry of the API, taking name_b64, path_b64 and link_target_b64 over the display
// strings beside them.
func (e *Entry) UnmarshalJSON(b []byte) error {
	var j entryJSON
	if err := json.Unmarshal(b, &j); err != nil {
		return err
	}
	out := Entry{Type: j.Type, Size: j.Size, Mode: j.Mode, Mtime: j.Mtime}
	var err error
	if out.Name, err = decodeName(j.Name, j.NameB64); err != nil {
		return fmt.Errorf("name_b64: %w", err)
	}
	if out.Path, err = decodeName(j.Path, j.PathB64); err != nil {
		return fmt.Errorf("path_b64: %w", err)
	}
	if out.LinkTarget, err = decodeName(j.LinkTarget, j.LinkTargetB64); err != nil {
		return fmt.Errorf("link_target_b64: %w", err)
	}
	*e = out
	return nil
}

// MarshalJSON writes the entry in the API's form.
func (e Entry) MarshalJSON() ([]byte, error) {
	j := entryJSON{Type: e.Type, Size: e.Size, Mode: e.Mode, Mtime: e.Mtime}
	j.Name, j.NameB64 = encodeName(e.Name)
	j.Path, j.PathB64 = encodeName(e.Path)
	j.LinkTarget, j.LinkTargetB64 = encodeName(e.LinkTarget)
	return json.Marshal(j)
}

type diffJSON struct {
	Added       []string  `json:"added"`
	AddedB64    []*string `json:"added_b64,omitempty"`
	Removed     []string  `json:"removed"`
	RemovedB64  []*string `json:"removed_b64,omitempty"`
	Modified    []string  `json:"modified"`
	ModifiedB64 []*string `json:"modified_b64,omitempty"`
	Truncated   bool      `json:"truncated,omitempty"`
}

func encodePaths(paths []string) (display []string, b64 []*string) {
	display = paths
	for i, p := range paths {
		d, e := encodeName(p)
		if e == "" {
			continue
		}
		if b64 == nil {
			b64 = make([]*string, len(paths))
			display = append([]string(nil), paths...)
		}
		display[i], b64[i] = d, &e
	}
	return display, b64
}

func decodePaths(display []string, b64 []*string) ([]string, error) {
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
			raw, err := decodeName(p, *b64[i])
			if err != nil {
				return nil, err
			}
			out[i] = raw
		}
	}
	return out, nil
}

// UnmarshalJSON reads a diff of the API, taking the base64 lists (added_b64, ...) over the display paths.
func (d *Diff) UnmarshalJSON(b []byte) error {
	var j diffJSON
	if err := json.Unmarshal(b, &j); err != nil {
		return err
	}
	var out Diff
	var err error
	if out.Added, err = decodePaths(j.Added, j.AddedB64); err != nil {
		return fmt.Errorf("added_b64: %w", err)
	}
	if out.Removed, err = decodePaths(j.Removed, j.RemovedB64); err != nil {
		return fmt.Errorf("removed_b64: %w", err)
	}
	if out.Modified, err = decodePaths(j.Modified, j.ModifiedB64); err != nil {
		return fmt.Errorf("modified_b64: %w", err)
	}
	out.Truncated = j.Truncated
	*d = out
	return nil
}

// MarshalJSON writes the diff in the API's form.
func (d Diff) MarshalJSON() ([]byte, error) {
	j := diffJSON{Truncated: d.Truncated}
	j.Added, j.AddedB64 = encodePaths(d.Added)
	j.Removed, j.RemovedB64 = encodePaths(d.Removed)
	j.Modified, j.ModifiedB64 = encodePaths(d.Modified)
	return json.Marshal(j)
}
