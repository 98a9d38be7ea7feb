package integration

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/ramify-dev/ramify/client"
	"github.com/ramify-dev/ramify/internal/s3test"
	"github.com/ramify-dev/ramify/internal/testserver"
)

// templateSetup prepares a session worth capturing: about 10 MB of data, an imported library, a function, a
// class instance, a working directory and an environment variable.
const templateSetup = sessionSetup + `
big = np.arange(10_000_000 // 8, dtype=np.float64)
`

// A template captures a prepared sandbox and leaves it running; three sandboxes created from it each have its
// files and variables, their own ids and addresses, and are independent; the template survives a restart and its
// delete leaves the sandboxes made from it alone.
func TestTemplateCaptureCreateRestart(t *testing.T) {
	s := testserver.Start(t)
	ctx := ctxT(t)
	src := create(t, s, &client.CreateRequest{MemMiB: 768})
	value(t, s, src, templateSetup)
	sh(t, s, src, "mkdir -p /root/data && head -c 2000000 /dev/urandom > /root/data/blob")
	sum := sh(t, s, src, "sha256sum /root/data/blob").Stdout

	tp, err := s.Client.SaveTemplate(ctx, "prepared", src)
	if err != nil {
		t.Fatal(err)
	}
	// sessionSetup's socket cannot be saved: the template says so.
	if tp.Size < 12_000_000 || tp.From != src || len(tp.NotSaved) != 1 || tp.NotSaved[0].Name != "sock" {
		t.Fatalf("template: size %d from %s not_saved %v", tp.Size, tp.From, tp.NotSaved)
	}
	t.Logf("capture of %d bytes held the sandbox %.0f ms", tp.Size, tp.CaptureMs)
	if v := value(t, s, src, "counter"); v != "41" {
		t.Fatalf("source after the capture: counter = %s", v)
	}
	if _, err := s.Client.SaveTemplate(ctx, "prepared", src); !client.IsStatus(err, 409) {
		t.Fatalf("second capture of the name: %v, want 409", err)
	}

	var kids []*client.Sandbox
	for i := 0; i < 3; i++ {
		start := time.Now()
		sb, err := s.Client.Create(ctx, client.CreateRequest{Template: "prepared"})
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("create %d from the template: %v (client-side)", i, time.Since(start).Round(time.Millisecond))
		if sb.Template != "prepared" || sb.MemMiB != 768 || sb.ID == src {
			t.Fatalf("sandbox from the template: %+v", sb)
		}
		kids = append(kids, sb)
	}
	ips := map[string]bool{}
	for i, k := range kids {
		ips[k.IP] = true
		if v := value(t, s, k.ID, "(counter, m.predict(2), df.shape, score(df, 1), os.getcwd(), os.environ['STAGE'], big.nbytes, float(big[-1]))"); v != "(41, 14, (1000, 2), 1248750.0, '/srv', 'two', 10000000, 1249999.0)" {
			t.Fatalf("sandbox %d from the template: %s", i, v)
		}
		if r := sh(t, s, k.ID, "sha256sum /root/data/blob"); r.Stdout != sum {
			t.Fatalf("sandbox %d: blob %q", i, r.Stdout)
		}
	}
	if len(ips) != 3 {
		t.Fatalf("sandboxes from the template share addresses: %v", ips)
	}
	value(t, s, kids[0].ID, "counter = 0")
	sh(t, s, kids[0].ID, "rm /root/data/blob")
	if v := value(t, s, kids[1].ID, "counter"); v != "41" {
		t.Fatalf("sandboxes are not independent: counter = %s", v)
	}
	if r := sh(t, s, kids[1].ID, "test -f /root/data/blob"); r.ExitCode != 0 {
		t.Fatal("a sandbox's file went when another removed its own")
	}

	s.Restart()
	ts, err := s.Client.Templates(ctx)
	if err != nil || len(ts) != 1 || ts[0].Name != "prepared" {
		t.Fatalf("templates after a restart: %+v %v", ts, err)
	}
	after := create(t, s, &client.CreateRequest{Template: "prepared", MemMiB: 512})
	if v := value(t, s, after, "counter"); v != "41" {
		t.Fatalf("from the template after a restart: counter = %s", v)
	}
	if err := s.Client.DeleteTemplate(ctx, "prepared"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Client.GetTemplate(ctx, "prepared"); !client.IsStatus(err, 404) {
		t.Fatalf("get after delete: %v, want 404", err)
	}
	if _, err := s.Client.Create(ctx, client.CreateRequest{Template: "prepared"}); !client.IsStatus(err, 404) {
		t.Fatalf("create from a deleted template: %v, want 404", err)
	}
	if v := value(t, s, kids[2].ID, "counter"); v != "41" {
		t.Fatalf("a sandbox after its template's delete: counter = %s", v)
	}
}

// Templates in an S3-compatible store: captured into the bucket, created from it, after a restart too.
func TestTemplateWithS3Store(t *testing.T) {
	endpoint := s3test.Endpoint(t)
	bucket := fmt.Sprintf("ramify-tpl-%d", os.Getpid())
	s := testserver.Start(t, "--s3-endpoint", endpoint, "--s3-bucket", bucket, "--s3-prefix", "snaps/",
		"--s3-access-key", s3test.AccessKey, "--s3-secret-key", s3test.SecretKey)
	ctx := ctxT(t)
	src := create(t, s, nil)
	value(t, s, src, templateSetup)
	if _, err := s.Client.SaveTemplate(ctx, "s3-tpl", src); err != nil {
		t.Fatal(err)
	}
	s.Restart()
	start := time.Now()
	id := create(t, s, &client.CreateRequest{Template: "s3-tpl"})
	t.Logf("create from an S3 template: %v (client-side)", time.Since(start).Round(time.Millisecond))
	if v := value(t, s, id, "(counter, big.nbytes)"); v != "(41, 10000000)" {
		t.Fatalf("from the S3 template: %s", v)
	}
	if err := s.Client.DeleteTemplate(ctx, "s3-tpl"); err != nil {
		t.Fatal(err)
	}
}

// The CLI's template verbs against a real server: save, ls, create --template, rm.
func TestTemplateCLI(t *testing.T) {
	s := testserver.Start(t)
	bin := testserver.Binary(t)
	env := []string{"RAMIFY_API_URL=" + s.URL, "RAMIFY_API_KEY=" + s.Key}
	id := create(t, s, nil)
	value(t, s, id, "x = 20")
	if out, errOut, code := runCLI(t, bin, env, "template", "save", "cli-tpl", id); code != 0 || out != "cli-tpl\n" ||
		!strings.Contains(errOut, "sandbox create --template cli-tpl") {
		t.Fatalf("template save: %q %q %d", out, errOut, code)
	}
	if out, _, code := runCLI(t, bin, env, "template", "ls"); code != 0 || !strings.Contains(out, "cli-tpl") || !strings.Contains(out, id) {
		t.Fatalf("template ls: %q %d", out, code)
	}
	out, errOut, code := runCLI(t, bin, env, "sandbox", "create", "--template", "cli-tpl")
	kid := strings.TrimSpace(out)
	if code != 0 || !strings.HasPrefix(kid, "sbx_") {
		t.Fatalf("create --template: %q %q %d", out, errOut, code)
	}
	if v := value(t, s, kid, "x + 1"); v != "21" {
		t.Fatalf("from the CLI's template: %s", v)
	}
	if _, _, code := runCLI(t, bin, env, "template", "rm", "cli-tpl"); code != 0 {
		t.Fatal("template rm failed")
	}
	if _, errOut, code := runCLI(t, bin, env, "template", "get", "cli-tpl"); code != 1 || !strings.Contains(errOut, "not found") {
		t.Fatalf("template get after rm: %q %d", errOut, code)
	}
}

// With --template-pool, sandboxes from a template are restored ahead of time; a create claims one (or restores
// one, if the pool is not ready yet): either way it has the template's state and its own id and address, and
// the request's spec.
func TestTemplatePoolRealServer(t *testing.T) {
	s := testserver.Start(t, "--template-pool", "1")
	ctx := ctxT(t)
	src := create(t, s, nil)
	value(t, s, src, templateSetup)
	if _, err := s.Client.SaveTemplate(ctx, "pooled", src); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		start := time.Now()
		sb, err := s.Client.Create(ctx, client.CreateRequest{Template: "pooled", MemMiB: 1536})
		if err != nil {
			t.Fatal(err)
		}
		t.Logf("create %d from a pooled template: %v (client-side)", i, time.Since(start).Round(time.Millisecond))
		if sb.MemMiB != 1536 || sb.Template != "pooled" || sb.ID == src {
			t.Fatalf("sandbox from the pooled template: %+v", sb)
		}
		if v := value(t, s, sb.ID, "(counter, df.shape, big.nbytes)"); v != "(41, (1000, 2), 10000000)" {
			t.Fatalf("sandbox %d from the pooled template: %s", i, v)
		}
	}
	if err := s.Client.DeleteTemplate(ctx, "pooled"); err != nil {
		t.Fatal(err)
	}
	if list, err := s.Client.List(ctx, client.ListOptions{}); err != nil || len(list) != 4 {
		t.Fatalf("sandboxes after the delete: %d %v", len(list), err)
	}
}
