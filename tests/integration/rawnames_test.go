package integration

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"slices"
	"testing"

	"github.com/ramify-dev/ramify/internal/testserver"
)

// rawReq sends an authenticated request and returns the status and the body's bytes.
func rawReq(t *testing.T, s *testserver.Server, method, path string, body []byte) (int, []byte) {
	t.Helper()
	req, _ := http.NewRequest(method, s.URL+path, bytes.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+s.Key)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

// listedName is a listing entry's lossless name: name_b64's bytes when present, else name.
type listedEntry struct {
	Name    string `json:"name"`
	NameB64 string `json:"name_b64"`
	Path    string `json:"path"`
	PathB64 string `json:"path_b64"`
}

func (e listedEntry) raw(t *testing.T) (name, path string) {
	t.Helper()
	name, path = e.Name, e.Path
	if e.NameB64 != "" {
		b, err := base64.StdEncoding.DecodeString(e.NameB64)
		if err != nil {
			t.Fatalf("name_b64 %q: %v", e.NameB64, err)
		}
		name = string(b)
	}
	if e.PathB64 != "" {
		b, err := base64.StdEncoding.DecodeString(e.PathB64)
		if err != nil {
			t.Fatalf("path_b64 %q: %v", e.PathB64, err)
		}
		path = string(b)
	}
	return name, path
}

// addr is the query that names e in a files request: path_b64 when the listing gave one, else path.
func (e listedEntry) addr() string {
	if e.PathB64 != "" {
		return "path_b64=" + url.QueryEscape(e.PathB64)
	}
	return "path=" + url.QueryEscape(e.Path)
}

// TestRawFileNames: names that are not UTF-8 (Latin-1 "café", next to the UTF-8 one) and names with terminal
// escapes are listed losslessly by the files API and the diff, and each can be read, overwritten and deleted by
// the form it was listed in.
func TestRawFileNames(t *testing.T) {
	s := testserver.Start(t)
	id := create(t, s, nil)
	c := s.Client
	ctx := ctxT(t)
	names := map[string]string{ // raw name -> content
		"caf\xe9":      "latin-1",
		"caf\xc3\xa9":  "utf-8",
		"\x1b[31mred":  "escape",
		"plain.txt":    "plain",
		"bad\xff\xfe!": "two bad bytes",
	}
	value(t, s, id, `import os
os.makedirs(b'/root/raw', exist_ok=True)
for n, c in [(b'caf\xe9', 'latin-1'), (b'caf\xc3\xa9', 'utf-8'), (b'\x1b[31mred', 'escape'), (b'plain.txt', 'plain'), (b'bad\xff\xfe!', 'two bad bytes')]:
    open(b'/root/raw/' + n, 'w').write(c)
os.makedirs(b'/root/dir\xe9', exist_ok=True)
open(b'/root/dir\xe9/inner', 'w').write('in')
os.symlink(b'/root/raw/caf\xe9', b'/root/raw/link')
`)
	base := "/v1/sandboxes/" + id

	// The listing: every name once, losslessly; b64 only for the names that are not UTF-8.
	code, body := rawReq(t, s, "GET", base+"/files/list?path=/root/raw", nil)
	if code != 200 {
		t.Fatalf("list: %d %s", code, body)
	}
	var list struct {
		Entries []struct {
			listedEntry
			LinkTarget    string `json:"link_target"`
			LinkTargetB64 string `json:"link_target_b64"`
		} `json:"entries"`
	}
	if err := json.Unmarshal(body, &list); err != nil {
		t.Fatal(err)
	}
	seen := map[string]listedEntry{}
	for _, e := range list.Entries {
		name, path := e.raw(t)
		if path != "/root/raw/"+name {
			t.Errorf("entry %q: path %q", name, path)
		}
		if _, dup := seen[name]; dup {
			t.Errorf("name %q listed twice", name)
		}
		if valid := (e.NameB64 == ""); valid != (name == e.Name) {
			t.Errorf("entry %q: name %q name_b64 %q: b64 must be given exactly when the name is not UTF-8", name, e.Name, e.NameB64)
		}
		seen[name] = e.listedEntry
		if name == "link" {
			if e.LinkTargetB64 == "" || e.LinkTargetB64 != base64.StdEncoding.EncodeToString([]byte("/root/raw/caf\xe9")) {
				t.Errorf("link: link_target %q link_target_b64 %q", e.LinkTarget, e.LinkTargetB64)
			}
		}
	}
	if len(seen) != len(names)+1 {
		t.Fatalf("listed %d distinct names, want %d: %s", len(seen), len(names)+1, body)
	}
	if e := seen["caf\xc3\xa9"]; e.Name != "café" || e.NameB64 != "" {
		t.Errorf("UTF-8 café listed as %+v", e)
	}
	if e := seen["\x1b[31mred"]; e.Name != "\x1b[31mred" || e.NameB64 != "" || !bytes.Contains(body, []byte(`"\u001b[31mred"`)) {
		t.Errorf("escape name listed as %+v in %s", e, body)
	}

	// Each one reads back by the form it was listed in.
	for name, content := range names {
		e, ok := seen[name]
		if !ok {
			t.Fatalf("%q not listed", name)
		}
		code, got := rawReq(t, s, "GET", base+"/files?"+e.addr(), nil)
		if code != 200 || string(got) != content {
			t.Errorf("read %q by %s: %d %q, want %q", name, e.addr(), code, got, content)
		}
		code, st := rawReq(t, s, "GET", base+"/files/stat?"+e.addr(), nil)
		var se listedEntry
		json.Unmarshal(st, &se) //nolint:errcheck // checked below
		if n, _ := se.raw(t); code != 200 || n != name {
			t.Errorf("stat %q: %d %s", name, code, st)
		}
	}

	// Overwrite the Latin-1 one through path_b64; the UTF-8 one keeps its content.
	latin := seen["caf\xe9"]
	code, body = rawReq(t, s, "PUT", base+"/files?"+latin.addr(), []byte("rewritten"))
	var wr listedEntry
	json.Unmarshal(body, &wr) //nolint:errcheck // checked below
	if _, p := wr.raw(t); code != 200 || p != "/root/raw/caf\xe9" || wr.PathB64 == "" {
		t.Fatalf("overwrite: %d %s", code, body)
	}
	if v := value(t, s, id, "(open(b'/root/raw/caf\\xe9').read(), open(b'/root/raw/caf\\xc3\\xa9').read())"); v != "('rewritten', 'utf-8')" {
		t.Fatalf("after overwrite: %s", v)
	}

	// mkdir by a JSON body's path_b64, then a new file below it by the Go client (raw bytes in a Go string).
	code, body = rawReq(t, s, "POST", base+"/files/mkdir", []byte(`{"path_b64": "`+base64.StdEncoding.EncodeToString([]byte("/root/raw/new\xe0dir"))+`"}`))
	if code != 200 {
		t.Fatalf("mkdir by path_b64: %d %s", code, body)
	}
	if _, err := c.WriteFile(ctx, id, "/root/raw/new\xe0dir/f\xe1", bytes.NewReader([]byte("go")), 0); err != nil {
		t.Fatal(err)
	}
	ents, err := c.ListFiles(ctx, id, "/root/raw/new\xe0dir")
	if err != nil || len(ents) != 1 || ents[0].Name != "f\xe1" || ents[0].Path != "/root/raw/new\xe0dir/f\xe1" {
		t.Fatalf("Go client list: %+v %v", ents, err)
	}
	if _, err := c.Mkdir(ctx, id, "/root/raw/new\xe0dir/sub\xe2", true); err != nil {
		t.Fatalf("Go client mkdir: %v", err)
	}
	if v := value(t, s, id, "sorted(os.listdir(b'/root/raw/new\\xe0dir'))"); v != `[b'f\xe1', b'sub\xe2']` {
		t.Fatalf("made by the Go client: %s", v)
	}
	if err := c.RemoveFile(ctx, id, "/root/raw/new\xe0dir", true); err != nil {
		t.Fatal(err)
	}

	// Bad requests: both forms, bad base64, a NUL byte.
	for _, q := range []string{
		"path=/root/raw/plain.txt&path_b64=" + url.QueryEscape(base64.StdEncoding.EncodeToString([]byte("/root/raw/plain.txt"))),
		"path_b64=not*base64",
		"path_b64=" + url.QueryEscape(base64.StdEncoding.EncodeToString([]byte("/root/raw/a\x00b"))),
	} {
		for _, m := range []string{"GET", "DELETE"} {
			code, body := rawReq(t, s, m, base+"/files?"+q, nil)
			var e struct{ Error string }
			if code != 400 || json.Unmarshal(body, &e) != nil || e.Error == "" {
				t.Errorf("%s ?%s: %d %s, want 400 with an error", m, q, code, body)
			}
		}
	}
	code, body = rawReq(t, s, "POST", base+"/files/mkdir", []byte(`{"path": "/root/x", "path_b64": "L3Jvb3QveA=="}`))
	if code != 400 {
		t.Errorf("mkdir with both: %d %s", code, body)
	}

	// A fork child changes some: the diff names each losslessly, and the two cafés apart.
	kids, err := c.Fork(ctx, id, 1)
	if err != nil {
		t.Fatal(err)
	}
	kid := kids[0]
	t.Cleanup(func() { c.Delete(ctx, kid) }) //nolint:errcheck // the server's cleanup removes it too
	value(t, s, kid, `import os
open(b'/root/raw/caf\xe9', 'w').write('changed in the child')
open(b'/root/raw/caf\xc3\xa9', 'w').write('changed too')
os.remove(b'/root/raw/\x1b[31mred')
open(b'/root/raw/new\xf0', 'w').write('new')
open(b'/root/dir\xe9/inner', 'w').write('changed')
`)
	// Delete one through the API, by its listed form.
	code, body = rawReq(t, s, "DELETE", "/v1/sandboxes/"+kid+"/files?"+seen["bad\xff\xfe!"].addr(), nil)
	if code != 204 {
		t.Fatalf("delete by path_b64: %d %s", code, body)
	}
	if v := value(t, s, kid, "sorted(os.listdir(b'/root/raw'))"); v != `[b'caf\xc3\xa9', b'caf\xe9', b'link', b'new\xf0', b'plain.txt']` {
		t.Fatalf("after delete: %s", v)
	}
	code, body = rawReq(t, s, "GET", base+"/diff/"+kid+"?paths_b64="+url.QueryEscape(base64.StdEncoding.EncodeToString([]byte("/root/raw")))+
		"&paths_b64="+url.QueryEscape(base64.StdEncoding.EncodeToString([]byte("/root/dir\xe9"))), nil)
	if code != 200 {
		t.Fatalf("diff: %d %s", code, body)
	}
	var d struct {
		Added, Removed, Modified          []string
		AddedB64, RemovedB64, ModifiedB64 []*string
	}
	dec := func(b []byte) {
		var m map[string]json.RawMessage
		if err := json.Unmarshal(b, &m); err != nil {
			t.Fatal(err)
		}
		for k, v := range map[string]any{"added": &d.Added, "removed": &d.Removed, "modified": &d.Modified,
			"added_b64": &d.AddedB64, "removed_b64": &d.RemovedB64, "modified_b64": &d.ModifiedB64} {
			if m[k] != nil {
				if err := json.Unmarshal(m[k], v); err != nil {
					t.Fatalf("%s: %v", k, err)
				}
			}
		}
	}
	dec(body)
	rawList := func(plain []string, b64 []*string) []string {
		if b64 != nil && len(b64) != len(plain) {
			t.Fatalf("b64 list %d long for %d paths: %s", len(b64), len(plain), body)
		}
		out := []string{}
		for i, p := range plain {
			if b64 != nil && b64[i] != nil {
				b, err := base64.StdEncoding.DecodeString(*b64[i])
				if err != nil {
					t.Fatal(err)
				}
				p = string(b)
			}
			out = append(out, p)
		}
		return out
	}
	added, removed, modified := rawList(d.Added, d.AddedB64), rawList(d.Removed, d.RemovedB64), rawList(d.Modified, d.ModifiedB64)
	wantAdded := []string{"/root/raw/new\xf0"}
	wantRemoved := []string{"/root/raw/\x1b[31mred", "/root/raw/bad\xff\xfe!"}
	wantModified := []string{"/root/dir\xe9/inner", "/root/raw/caf\xc3\xa9", "/root/raw/caf\xe9"}
	if !slices.Equal(added, wantAdded) || !slices.Equal(removed, wantRemoved) || !slices.Equal(modified, wantModified) {
		t.Fatalf("diff = +%q -%q M%q, want +%q -%q M%q\n%s", added, removed, modified, wantAdded, wantRemoved, wantModified, body)
	}
	if d.ModifiedB64[1] != nil || d.Modified[1] != "/root/raw/café" {
		t.Errorf("the UTF-8 café is plain in the diff: %s", body)
	}
	// The Go client's Diff gives the same raw paths; a diff with both forms of paths is refused.
	gd, err := c.Diff(ctx, id, kid, []string{"/root/raw", "/root/dir\xe9"})
	if err != nil || !slices.Equal(gd.Added, wantAdded) || !slices.Equal(gd.Removed, wantRemoved) || !slices.Equal(gd.Modified, wantModified) {
		t.Fatalf("Go client diff: %+v %v", gd, err)
	}
	code, body = rawReq(t, s, "GET", base+"/diff/"+kid+"?paths=/root&paths_b64=L3Jvb3Q=", nil)
	if code != 400 {
		t.Errorf("diff with paths and paths_b64: %d %s", code, body)
	}
}
