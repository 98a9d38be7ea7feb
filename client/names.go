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
	rawname.Names
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
	if out.Name, out.Path, err = j.Names.Decode(); err != nil {
		return err
	}
	if out.LinkTarget, err = rawname.Decode(j.LinkTarget, j.LinkTargetB64); err != nil {
		return fmt.Errorf("link_target_b64: %w", err)
	}
	*e = out
	return nil
}

// MarshalJSON writes the entry in the API's form.
func (e Entry) MarshalJSON() ([]byte, error) {
	j := entryJSON{Names: rawname.EncodeNames(e.Name, e.Path), Type: e.Type, Size: e.Size, Mode: e.Mode, Mtime: e.Mtime}
	j.LinkTarget, j.LinkTargetB64 = rawname.Encode(e.LinkTarget)
	return json.Marshal(j)
}

// UnmarshalJSON reads a diff of the API, taking the base64 lists (added_b64, ...) over the display paths.
func (d *Diff) UnmarshalJSON(b []byte) error {
	var j rawname.Lists
	if err := json.Unmarshal(b, &j); err != nil {
		return err
	}
	var out Diff
	var err error
	if out.Added, out.Removed, out.Modified, err = j.Decode(); err != nil {
		return err
	}
	out.Truncated = j.Truncated
	*d = out
	return nil
}

// MarshalJSON writes the diff in the API's form.
func (d Diff) MarshalJSON() ([]byte, error) {
	return json.Marshal(rawname.EncodeLists(d.Added, d.Removed, d.Modified, d.Truncated))
}
