package security

import (
	"bytes"
	"context"
	"encoding/base64"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ramify-dev/ramify/client"
	"github.com/ramify-dev/ramify/internal/testserver"
)

// path_b64 (and paths_b64) carry any bytes: "..", NUL, a path through a symlink the sandbox planted, a name that
// is not UTF-8. None of them reads, lists, writes, removes or diffs anything outside the sandbox's root.
func TestRawPathsStayInTheSandbox(t *testing.T) {
	s := testserver.Start(t, "--fork-ahead", "0")
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	sb, err := s.Client.Create(ctx, client.CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Client.Delete(context.Background(), sb.ID) //nolint:errcheck // the server's stop removes it anyway
	other, err := s.Client.Create(ctx, client.CreateRequest{})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Client.Delete(context.Background(), other.ID) //nolint:errcheck // as above
	hostDir := t.TempDir()
	secret := filepath.Join(hostDir, "secret")
	if err := os.WriteFile(secret, []byte("host-secret"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Client.Exec(ctx, sb.ID, client.ExecRequest{Cmd: "ln -s / /root/hostroot; ln -s ../../../../../../.. /root/up; " +
		"mkdir -p /root/d; ln -s " + hostDir + " /root/d/\xff"}); err != nil {
		t.Fatal(err)
	}
	call := func(method, path string, q url.Values, body []byte) (int, string) {
		req, _ := http.NewRequestWithContext(ctx, method, s.URL+"/v1/sandboxes/"+sb.ID+path+"?"+q.Encode(), bytes.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+s.Key)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	b64 := func(p string) url.Values {
		return url.Values{"path_b64": {base64.StdEncoding.EncodeToString([]byte(p))}}
	}
	for _, p := range []string{
		"/../../../../.." + secret, ".." + secret, "/root/hostroot" + secret, "/root/up" + secret,
		"/root/d/\xff/secret", "/root/d/\xff/../../../.." + secret, secret + "\x00", "/root/\x00/../.." + secret,
	} {
		for _, ep := range []string{"/files", "/files/stat", "/files/list"} {
			if code, body := call("GET", ep, b64(p), nil); strings.Contains(body, "host-secret") || (ep == "/files" && code == 200) {
				t.Errorf("GET %s path_b64=%q: %d %s", ep, p, code, body)
			}
		}
		if code, body := call("GET", "/files/list", b64(filepath.Dir(p)), nil); strings.Contains(body, `"secret"`) {
			t.Errorf("list of %q: %d %s", filepath.Dir(p), code, body)
		}
		call("PUT", "/files", b64(p+"-written"), []byte("pwned"))
		call("DELETE", "/files", b64(p), nil)
		call("POST", "/files/mkdir", b64(p+"-dir"), nil)
		if code, body := call("GET", "/diff/"+other.ID, url.Values{"paths_b64": {base64.StdEncoding.EncodeToString([]byte(filepath.Dir(p)))}}, nil); strings.Contains(body, `/secret"`) {
			t.Errorf("diff of %q: %d %s", filepath.Dir(p), code, body)
		}
	}
	ents, _ := os.ReadDir(hostDir)
	if len(ents) != 1 {
		var names []string
		for _, e := range ents {
			names = append(names, e.Name())
		}
		t.Errorf("the host directory now holds %v", names)
	}
	if b, _ := os.ReadFile(secret); string(b) != "host-secret" {
		t.Errorf("the host file was changed: %q", b)
	}
}
