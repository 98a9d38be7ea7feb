package client

import (
	"encoding/json"
	"fmt"
	"net/url"
	"time"

	"github.com/ramify-dev/ramify/internal/rawname"
)

// File names in a sandbox are bytes, and a Go string holds any bytes: every path this package takes is sent
// as its bytes, and every name or path it returns (Entry.Name, Entry.Path, Entry.LinkTarget, the lists of a
// Diff) is the file's raw name, also when it is not valid UTF-8. On the wire such a name travels as a display
// string with its standard base64 beside it ("path" and "path_b64", see the API's docs); this package reads and
// writes that form.

// pathQuery is the query naming path: path, or path_b64 when path is not valid UTF-8.
func pathQuery(path string) url.Values {
	if _, b := rawname.Encode(path); b != "" {
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
	if out.Name, err = rawname.Decode(j.Name, j.NameB64); err != nil {
		return fmt.Errorf("name_b64: %w", err)
	}
	if out.Path, err = rawname.Decode(j.Path, j.PathB64); err != nil {
		return fmt.Errorf("path_b64: %w", err)
	}
	if out.LinkTarget, err = rawname.Decode(j.LinkTarget, j.LinkTargetB64); err != nil {
		return fmt.Errorf("link_target_b64: %w", err)
	}
	*e = out
	return nil
}

// MarshalJSON writes the entry in the API's form.
func (e Entry) MarshalJSON() ([]byte, error) {
	j := entryJSON{Type: e.Type, Size: e.Size, Mode: e.Mode, Mtime: e.Mtime}
	j.Name, j.NameB64 = rawname.Encode(e.Name)
	j.Path, j.PathB64 = rawname.Encode(e.Path)
	j.LinkTarget, j.LinkTargetB64 = rawname.Encode(e.LinkTarget)
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

// UnmarshalJSON reads a diff of the API, taking the base64 lists (added_b64, ...) over the display paths.
func (d *Diff) UnmarshalJSON(b []byte) error {
	var j diffJSON
	if err := json.Unmarshal(b, &j); err != nil {
		return err
	}
	var out Diff
	var err error
	if out.Added, err = rawname.DecodeList(j.Added, j.AddedB64); err != nil {
		return fmt.Errorf("added_b64: %w", err)
	}
	if out.Removed, err = rawname.DecodeList(j.Removed, j.RemovedB64); err != nil {
		return fmt.Errorf("removed_b64: %w", err)
	}
	if out.Modified, err = rawname.DecodeList(j.Modified, j.ModifiedB64); err != nil {
		return fmt.Errorf("modified_b64: %w", err)
	}
	out.Truncated = j.Truncated
	*d = out
	return nil
}

// MarshalJSON writes the diff in the API's form.
func (d Diff) MarshalJSON() ([]byte, error) {
	j := diffJSON{Truncated: d.Truncated}
	j.Added, j.AddedB64 = rawname.EncodeList(d.Added)
	j.Removed, j.RemovedB64 = rawname.EncodeList(d.Removed)
	j.Modified, j.ModifiedB64 = rawname.EncodeList(d.Modified)
	return json.Marshal(j)
}
