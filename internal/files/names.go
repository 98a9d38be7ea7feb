package files

import (
	"encoding/base64"
	"encoding/json"
	"fmt"
	"time"

	"github.com/ramify-dev/ramify/internal/errdefs"
	"github.com/ramify-dev/ramify/internal/rawname"
)

// Names of sandbox files are bytes: the API's lossless form of them in JSON is package rawname's.

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
	rawname.Names
	Type          string    `json:"type"`
	Size          int64     `json:"size"`
	Mode          string    `json:"mode"`
	MTime         time.Time `json:"mtime"`
	LinkTarget    string    `json:"link_target"`
	LinkTargetB64 string    `json:"link_target_b64,omitempty"`
}

// MarshalJSON writes the entry in the API's form: name, path and link_target as strings, each with an _b64
// beside it when its bytes are not valid UTF-8 (see rawname.Encode).
func (e Entry) MarshalJSON() ([]byte, error) {
	j := entryJSON{Names: rawname.EncodeNames(e.Name, e.Path), Type: e.Type, Size: e.Size, Mode: e.Mode, MTime: e.MTime}
	j.LinkTarget, j.LinkTargetB64 = rawname.Encode(e.LinkTarget)
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
	if out.Name, out.Path, err = j.Names.Decode(); err != nil {
		return err
	}
	if out.LinkTarget, err = rawname.Decode(j.LinkTarget, j.LinkTargetB64); err != nil {
		return fmt.Errorf("link_target_b64: %w", err)
	}
	*e = out
	return nil
}
