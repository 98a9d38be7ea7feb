package integration

import (
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"github.com/ramify-dev/ramify/client"
	"github.com/ramify-dev/ramify/internal/testserver"
)

// A named image end to end, through the API: built on the server from a Debian package absent from the default
// image (tree) and a pip requirement from a local index, then a sandbox on it runs both, its fork children and
// a pause/resume keep the image, a restart keeps it, the image cannot be removed while used, and errors are
// clear. The images directory is a fresh one whose default image is the shared one (not rebuilt or changed).
func TestNamedImage(t *testing.T) {
	dir := testserver.ImageDir(t)
	index := testserver.ServePyIndex(t, testserver.PyPackage{Name: "ramify-hello", Version: "1.0", Module: "ramify_hello",
		Source: "def hello():\n    return 'hello from the image'\n"})
	s := testserver.Start(t, "--image-dir", dir, "--warm-pool", "1")
	ctx := ctxT(t)
	c := s.Client

	// Bad input is refused before anything is built.
	for _, bad := range []client.BuildImageRequest{
		{Name: "Bad Name", Apt: []string{"tree"}},
		{Name: "x", Pip: []string{"ramify-hello"}}, // no index
		{Name: "default", Apt: []string{"tree"}},
		{Name: "x"},
	} {
		if _, err := c.BuildImage(ctx, bad, nil); !errors.Is(err, client.ErrInvalid) {
			t.Errorf("build %+v: %v, want invalid", bad, err)
		}
	}
	if _, err := c.Create(ctx, client.CreateRequest{Image: "nosuch"}); !errors.Is(err, client.ErrNotFound) ||
		!strings.Contains(err.Error(), `image "nosuch" not found`) {
		t.Errorf("create on an unknown image: %v", err)
	}
	if _, err := c.Create(ctx, client.CreateRequest{Image: "../etc"}); !errors.Is(err, client.ErrInvalid) {
		t.Errorf("create on a bad image name: %v", err)
	}

	var lines []string
	img, err := c.BuildImage(ctx, client.BuildImageRequest{Name: "hello", Apt: []string{"tree"}, Pip: []string{"ramify-hello==1.0"},
		PipIndex: index}, func(l string) { lines = append(lines, l) })
	if err != nil {
		t.Fatalf("build: %v\nprogress:\n%s", err, strings.Join(lines, "\n"))
	}
	if img.Name != "hello" || !slices.Equal(img.Apt, []string{"tree"}) || img.SizeBytes <= 0 {
		t.Errorf("built image: %+v", img)
	}
	if !slices.ContainsFunc(lines, func(l string) bool { return strings.Contains(l, "pip: installed ramify-hello-1.0") }) {
		t.Errorf("no pip progress line in:\n%s", strings.Join(lines, "\n"))
	}

	plain := create(t, s, nil)
	if got := sh(t, s, plain, "command -v tree || echo absent").Stdout; !strings.Contains(got, "absent") {
		t.Errorf("the default image has tree now: %q", got)
	}
	sb, err := c.Create(ctx, client.CreateRequest{Image: "hello"})
	if err != nil {
		t.Fatal(err)
	}
	id := sb.ID
	if sb.Image != "hello" {
		t.Errorf("created sandbox's image %q", sb.Image)
	}
	checkImage := func(id string) {
		t.Helper()
		if r := sh(t, s, id, "tree -L 1 / | tail -1"); r.ExitCode != 0 || !strings.Contains(r.Stdout, "directories") {
			t.Errorf("%s: tree: %+v", id, r)
		}
		if v := value(t, s, id, "import ramify_hello; ramify_hello.hello()"); v != "'hello from the image'" {
			t.Errorf("%s: module: %s", id, v)
		}
	}
	checkImage(id)
	value(t, s, id, "x = 42")
	sh(t, s, id, "echo mine > /root/f")

	kids := s.Fork(t, id, 2)
	for _, k := range kids {
		if g, err := c.Get(ctx, k); err != nil || g.Image != "hello" {
			t.Errorf("fork child %s: %+v, %v", k, g, err)
		}
		checkImage(k)
	}
	sh(t, s, kids[0], "echo changed > /root/f")
	if d, err := c.Diff(ctx, id, kids[0], []string{"/root"}); err != nil || !slices.Equal(d.Modified, []string{"/root/f"}) {
		t.Errorf("diff of a fork on the image: %+v, %v", d, err)
	}
	// Different images: the diff includes what the images differ in.
	if d, err := c.Diff(ctx, plain, id, []string{"/usr/bin"}); err != nil || !slices.Contains(d.Added, "/usr/bin/tree") {
		t.Errorf("diff across images: %+v, %v", d, err)
	}
	if err := c.MergeInto(ctx, plain, kids[1]); !errors.Is(err, client.ErrConflict) || !strings.Contains(err.Error(), "different images") {
		t.Errorf("merge across images: %v", err)
	}
	if err := c.DeleteImage(ctx, "hello"); !errors.Is(err, client.ErrConflict) {
		t.Errorf("delete of a used image: %v", err)
	}
	if _, err := c.BuildImage(ctx, client.BuildImageRequest{Name: "hello", Apt: []string{"tree"}}, nil); !errors.Is(err, client.ErrConflict) {
		t.Errorf("rebuild of a used image: %v", err)
	}
	imgs, err := c.Images(ctx)
	if err != nil || len(imgs) != 2 || !imgs[0].Default || imgs[1].Name != "hello" || imgs[1].Sandboxes != 3 {
		t.Errorf("images: %+v, %v", imgs, err)
	}

	// Pause and resume: back on the same image, with its variables.
	if _, _, err := c.Pause(ctx, kids[0]); err != nil {
		t.Fatal(err)
	}
	if _, err := c.WaitStatus(ctx, kids[0], "paused"); err != nil {
		t.Fatal(err)
	}
	if _, _, err := c.Resume(ctx, kids[0]); err != nil {
		t.Fatal(err)
	}
	if _, err := c.WaitStatus(ctx, kids[0], "running"); err != nil {
		t.Fatal(err)
	}
	checkImage(kids[0])
	if v := value(t, s, kids[0], "x"); v != "42" {
		t.Errorf("resumed child's x = %s", v)
	}

	// A template of a sandbox on the image keeps the image; a create from it cannot ask for another one.
	if _, err := c.SaveTemplate(ctx, "on-hello", id); err != nil {
		t.Fatal(err)
	}
	tsb, err := c.Create(ctx, client.CreateRequest{Template: "on-hello"})
	if err != nil || tsb.Image != "hello" {
		t.Fatalf("create from a template on the image: %+v, %v", tsb, err)
	}
	checkImage(tsb.ID)
	if v := value(t, s, tsb.ID, "x"); v != "42" {
		t.Errorf("template's x = %s", v)
	}
	if _, err := c.Create(ctx, client.CreateRequest{Template: "on-hello", Image: "default"}); !errors.Is(err, client.ErrInvalid) {
		t.Errorf("create from the template on another image: %v", err)
	}
	if err := c.Delete(ctx, tsb.ID); err != nil {
		t.Fatal(err)
	}
	if img, err := c.GetImage(ctx, "hello"); err != nil || img.Templates != 1 {
		t.Errorf("image with a template: %+v, %v", img, err)
	}
	if err := c.DeleteTemplate(ctx, "on-hello"); err != nil {
		t.Fatal(err)
	}

	// A paused sandbox whose image has gone (removed behind the server's back) cannot resume, and says why.
	if _, err := c.BuildImage(ctx, client.BuildImageRequest{Name: "gone", Apt: []string{"tree"}}, nil); err != nil {
		t.Fatal(err)
	}
	g := create(t, s, &client.CreateRequest{Image: "gone"})
	if _, _, err := c.Pause(ctx, g); err != nil {
		t.Fatal(err)
	}
	if _, err := c.WaitStatus(ctx, g, "paused"); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(filepath.Join(dir, "named", "gone")); err != nil {
		t.Fatal(err)
	}
	if _, _, err := c.Resume(ctx, g); !errors.Is(err, client.ErrConflict) || !strings.Contains(err.Error(), `image "gone"`) {
		t.Errorf("resume on a removed image: %v", err)
	}
	if err := c.Delete(ctx, g); err != nil {
		t.Fatal(err)
	}

	// A restart keeps running sandboxes on their image.
	s.Restart()
	c = s.Client // the restarted server listens on another port
	checkImage(id)
	if got := sh(t, s, id, "cat /root/f").Stdout; got != "mine\n" {
		t.Errorf("after restart: /root/f = %q", got)
	}

	for _, sid := range append([]string{id, plain}, kids...) {
		if err := c.Delete(ctx, sid); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.DeleteImage(ctx, "hello"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.GetImage(ctx, "hello"); !errors.Is(err, client.ErrNotFound) {
		t.Errorf("deleted image: %v", err)
	}
}

// The CLI's image verbs on a real server: build with progress and a requirements file, a sandbox on the image,
// ls, rm refused while used, then done; and the errors users meet (a bad name, pip without an index).
func TestNamedImageCLI(t *testing.T) {
	bin := testserver.Binary(t)
	dir := testserver.ImageDir(t)
	index := testserver.ServePyIndex(t, testserver.PyPackage{Name: "cli-hello", Version: "2.0", Module: "cli_hello",
		Source: "VALUE = 7\n"})
	s := testserver.Start(t, "--image-dir", dir)
	env := []string{"RAMIFY_API_URL=" + s.URL, "RAMIFY_API_KEY=" + s.Key}
	reqs := filepath.Join(t.TempDir(), "requirements.txt")
	if err := os.WriteFile(reqs, []byte("# what the agent needs\ncli-hello==2.0\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	out, errOut, code := runCLI(t, bin, env, "image", "build", "--name", "cli-img", "--apt", "tree", "--requirements", reqs, "--pip-index", index)
	if code != 0 || out != "cli-img\n" || !strings.Contains(errOut, "pip: installed cli-hello-2.0") {
		t.Fatalf("image build: exit %d\nstdout %q\nstderr %s", code, out, errOut)
	}
	id, errOut, code := runCLI(t, bin, env, "sandbox", "create", "--image", "cli-img")
	id = strings.TrimSpace(id)
	if code != 0 {
		t.Fatalf("create --image: exit %d: %s", code, errOut)
	}
	if out, _, code := runCLI(t, bin, env, "run", id, "import cli_hello; cli_hello.VALUE"); code != 0 || out != "7\n" {
		t.Errorf("run on the image: exit %d, %q", code, out)
	}
	if out, _, code := runCLI(t, bin, env, "get", id); code != 0 || !strings.Contains(out, "image:") || !strings.Contains(out, "cli-img") {
		t.Errorf("get: exit %d\n%s", code, out)
	}
	if out, _, code := runCLI(t, bin, env, "image", "ls"); code != 0 || !strings.Contains(out, "cli-img") || !strings.Contains(out, "cli-hello==2.0") {
		t.Errorf("image ls: exit %d\n%s", code, out)
	}
	if _, errOut, code := runCLI(t, bin, env, "image", "rm", "cli-img"); code == 0 || !strings.Contains(errOut, "1 sandboxes") {
		t.Errorf("image rm of a used image: exit %d, %s", code, errOut)
	}
	if _, errOut, code := runCLI(t, bin, env, "image", "build", "--name", "Bad", "--apt", "tree"); code == 0 || !strings.Contains(errOut, "bad image name") {
		t.Errorf("bad name: exit %d, %s", code, errOut)
	}
	if _, errOut, code := runCLI(t, bin, env, "image", "build", "--name", "x", "--pip", "cli-hello"); code == 0 || !strings.Contains(errOut, "pip_index") {
		t.Errorf("pip without an index: exit %d, %s", code, errOut)
	}
	if _, errOut, code := runCLI(t, bin, env, "rm", id); code != 0 {
		t.Fatalf("rm: %s", errOut)
	}
	if _, errOut, code := runCLI(t, bin, env, "image", "rm", "cli-img"); code != 0 {
		t.Errorf("image rm: exit %d, %s", code, errOut)
	}
}

// The copy layer driver runs sandboxes on a named image too: its fork copies the writable layer, never the image.
func TestNamedImageCopyDriver(t *testing.T) {
	dir := testserver.ImageDir(t)
	s := testserver.Start(t, "--image-dir", dir, "--layer-driver", "copy", "--warm-pool", "0")
	ctx := ctxT(t)
	if _, err := s.Client.BuildImage(ctx, client.BuildImageRequest{Name: "trees", Apt: []string{"tree"}}, nil); err != nil {
		t.Fatal(err)
	}
	id := create(t, s, &client.CreateRequest{Image: "trees"})
	sh(t, s, id, "echo parent > /root/f")
	kid := s.Fork(t, id, 1)[0]
	for _, sid := range []string{id, kid} {
		if r := sh(t, s, sid, "tree -L 1 /root | tail -1; cat /root/f"); r.ExitCode != 0 || !strings.Contains(r.Stdout, "parent") {
			t.Errorf("%s on the copy driver: %+v", sid, r)
		}
	}
	if d, err := s.Client.Diff(ctx, id, kid, []string{"/root"}); err != nil || len(d.Added)+len(d.Removed)+len(d.Modified) != 0 {
		t.Errorf("diff of an unchanged fork: %+v, %v", d, err)
	}
	// Once no sandbox uses it, the name can be rebuilt: the new image replaces the old one.
	first, err := s.Client.GetImage(ctx, "trees")
	if err != nil {
		t.Fatal(err)
	}
	for _, sid := range []string{id, kid} {
		if err := s.Client.Delete(ctx, sid); err != nil {
			t.Fatal(err)
		}
	}
	again, err := s.Client.BuildImage(ctx, client.BuildImageRequest{Name: "trees", Apt: []string{"tree", "bc"}}, nil)
	if err != nil || !again.BuiltAt.After(first.BuiltAt) || !slices.Equal(again.Apt, []string{"bc", "tree"}) {
		t.Fatalf("rebuild: %+v, %v", again, err)
	}
	if imgs, err := s.Client.Images(ctx); err != nil || len(imgs) != 2 {
		t.Errorf("images after a rebuild: %+v, %v", imgs, err)
	}
	id = create(t, s, &client.CreateRequest{Image: "trees"})
	if r := sh(t, s, id, "echo 6*7 | bc"); r.Stdout != "42\n" {
		t.Errorf("the rebuilt image: %+v", r)
	}
}
