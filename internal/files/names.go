package files

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/ramify-dev/ramify/internal/errdefs"
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

// EncodeName returns the JSON fields for the raw name s: the string itself and "" when s is valid UTF-8, else
// the display form and the base64 of s.
func EncodeName(s string) (display, b64 string) {
	if utf8.ValidString(s) {
		return s, ""
	}
	return DisplayName(s), base64.StdEncoding.EncodeToString([]byte(s))
}

// DisplayName is s with each byte that is not part of valid UTF-8 replaced with U+FFFD (what encoding/json does
// to such a string): for showing, never for naming a file.
func DisplayName(s string) string {
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

// DecodeName is the raw name that a display string and its base64 (empty when there is none) stand for: the
// inverse of EncodeName.
func DecodeName(display, b64 string) (string, error) {
	if b64 == "" {
		return display, nil
	}
	b, err := base64.StdEncoding.DecodeString(b64)
	if err != nil {
		return "", err
	}
	return string(b), nil
}

// EncodePaths returns the parallel base64 list for paths: nil when every path is valid UTF-8, else one element
// per path, the base64 of a path that is not valid UTF-8 and nil for one that is. The paths themselves are to be
// sent through DisplayName.
func EncodePaths(paths []string) (display []string, b64 []*string) {
	display = paths
	for i, p := range paths {
		if utf8.ValidString(p) {
			continue
		}
		if b64 == nil {
			b64 = make([]*string, len(paths))
			display = append([]string(nil), paths...)
		}
		d, e := EncodeName(p)
		display[i], b64[i] = d, &e
	}
	return display, b64
}

// DecodePaths is the inverse of EncodePaths: the raw paths of display and its parallel base64 list (nil: none).
func DecodePaths(display []string, b64 []*string) ([]string, error) {
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
			raw, err := DecodeName(p, *b64[i])
			if err != nil {
				return nil, err
			}
			out[i] = raw
		}
	}
	return out, nil
}

// PathParam returns the path a request gives as field (its plain form, which may percent-encode raw bytes in a
// query) or as field+"_b64" (standard base64 of the raw bytes): exactly one of the two, else an
// errdefs.ErrInvalid naming them. has reports whether a form was given at all; "" and false when neither was.
func PathParam(field, plain string, hasPlain bool, b64 string, hasB64 bool) (string, bool, error) {
	switch {
	case hasPlain && hasB64:
		return "", false, errdefs.New(errdefs.ErrInvalid, fmt.Sprintf("give %s or %s_b64, not both", field, field))
	case hasB64:
		raw, err := base64.StdEncoding.DecodeString(b64)
		if err != nil {
			return "", false, errdefs.New(errdefs.ErrInvalid, fmt.Sprintf("%s_b64 is not valid standard base64: %v", field, err))
		}
		return string(raw), true, nil
	case hasPlain:
		return plain, true, nil
	}
	return "", false, nil
}

// entryJSON is Entry's wire form.
type entryJSON struct {
	Name          string    `json:"name"`
	NameB64       string    `json:"name_b64,omitempty"`
	Path          string    `json:"path"`
	PathB64       string    `json:"path_b64,omitempty"`
	Type          string    `json:"type"`
	Size          int64     `json:"size"`
	Mode          string    `json:"mode"`
	MTime         time.Time `json:"mtime"`
	LinkTarget    string    `json:"link_target"`
	LinkTargetB64 string    `json:"link_target_b64,omitempty"`
}

// MarshalJSON writes the entry in the API's form: name, path and link_target as strings, each with an _b64
// beside it when its bytes are not valid UTF-8 (see EncodeName).
func (e Entry) MarshalJSON() ([]byte, error) {
	j := entryJSON{Type: e.Type, Size: e.Size, Mode: e.Mode, MTime: e.MTime}
	j.Name, j.NameB64 = EncodeName(e.Name)
	j.Path, j.PathB64 = EncodeName(e.Path)
	j.LinkTarget, j.LinkTargetB64 = EncodeName(e.LinkTarget)
	return json.Marshal(j)
}

// UnmarshalJSON reads the API's form back, taking each _b64 field over its display string.
func (e *Entry) UnmarshalJSON(b []byte) error {
	var j entryJSON
	if err := json.Unmarshal(b, &j); err != nil {
		return err
	}
	var err error
	out := Entry{Type: j.Type, Size: j.Size, Mode: j.Mode, MTime: j.MTime}
	if out.Name, err = DecodeName(j.Name, j.NameB64); err != nil {
		return fmt.Errorf("name_b64: %w", err)
	}
	if out.Path, err = DecodeName(j.Path, j.PathB64); err != nil {
		return fmt.Errorf("path_b64: %w", err)
	}
	if out.LinkTarget, err = DecodeName(j.LinkTarget, j.LinkTargetB64); err != nil {
		return fmt.Errorf("link_target_b64: %w", err)
	}
	*e = out
	return nil
}
