// Package console tests the web console (internal/ui) in a real browser: headless Chromium, driven by chromedp,
// against a real server with real sandboxes. It signs in, watches a fork appear live in the tree, runs a cell,
// runs a command, opens a diff with a line diff, merges from the UI and sees the tree change, and fails on any
// console error or uncaught exception. Screenshots go to $RAMIFY_TEST_ARTIFACTS (else the test's temp dir).
package console

import (
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/fetch"
	"github.com/chromedp/cdproto/log"
	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"

	"github.com/ramify-dev/ramify/client"
	"github.com/ramify-dev/ramify/internal/testserver"
)

// chromium finds the browser: $RAMIFY_CHROMIUM, else Debian's chromium on the PATH. Without one the test skips,
// or fails under RAMIFY_REQUIRE_BROWSER=1 (make test-go).
func chromium(t *testing.T) string {
	if p := os.Getenv("RAMIFY_CHROMIUM"); p != "" {
		return p
	}
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			return p
		}
	}
	const msg = "no chromium on the PATH (apt-get install chromium; scripts/setup installs it)"
	if os.Getenv("RAMIFY_REQUIRE_BROWSER") == "1" {
		t.Fatal(msg + " and RAMIFY_REQUIRE_BROWSER=1")
	}
	t.Skip(msg + ": the console's browser test is skipped")
	return ""
}

// browser starts a fresh headless Chromium (a new profile, background networking off) and returns a tab's context,
// and the console errors and exceptions it reports.
func browser(t *testing.T) (context.Context, *consoleLog) {
	// No UserDataDir: chromedp then gives Chromium a fresh profile directory of its own, and removes it once the
	// browser has exited.
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(chromium(t)),
		chromedp.Headless,
		chromedp.NoSandbox, // root
		chromedp.DisableGPU,
		chromedp.NoFirstRun,
		chromedp.NoDefaultBrowserCheck,
		chromedp.WindowSize(1366, 900),
		chromedp.Flag("disable-background-networking", true), // the network is closed: it would stall
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-extensions", true),
		chromedp.Flag("disable-dev-shm-usage", true),
	}
	actx, cancelA := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancelB := chromedp.NewContext(actx)
	ctx, cancelT := context.WithTimeout(ctx, 10*time.Minute)
	t.Cleanup(func() { cancelT(); cancelB(); cancelA() })
	cl := &consoleLog{cut: map[string]bool{}}
	listen(t, ctx, cl)
	return ctx, cl
}

// listen records the console errors, warnings and uncaught exceptions of ctx's tab in cl.
func listen(t *testing.T, ctx context.Context, cl *consoleLog) {
	chromedp.ListenTarget(ctx, func(ev any) {
		switch ev := ev.(type) {
		case *runtime.EventConsoleAPICalled:
			if ev.Type == runtime.APITypeError || ev.Type == runtime.APITypeWarning {
				var args []string
				for _, a := range ev.Args {
					args = append(args, string(a.Value)+a.Description)
				}
				cl.add("console." + string(ev.Type) + ": " + strings.Join(args, " "))
			}
		case *runtime.EventExceptionThrown:
			cl.add("exception: " + ev.ExceptionDetails.Error())
		case *log.EventEntryAdded:
			// ERR_NETWORK_CHANGED: Chromium aborts requests in flight when the host's interfaces change, as they do
			// whenever the server adds a sandbox's veth; the console retries its GETs, and the error is the host's.
			if strings.Contains(ev.Entry.Text, "net::ERR_NETWORK_CHANGED") {
				t.Logf("ignored: %s %s", ev.Entry.Text, ev.Entry.URL)
				cl.mu.Lock()
				cl.changes++
				cl.mu.Unlock()
				return
			}
			if cl.wasCut(ev.Entry.URL) {
				t.Logf("cut by the test: %s %s", ev.Entry.Text, ev.Entry.URL)
				return
			}
			if ev.Entry.Level == log.LevelError || ev.Entry.Level == log.LevelWarning {
				cl.add(fmt.Sprintf("log %s (%s): %s %s", ev.Entry.Level, ev.Entry.Source, ev.Entry.Text, ev.Entry.URL))
			}
		}
	})
	if err := chromedp.Run(ctx, log.Enable(), runtime.Enable()); err != nil {
		t.Fatalf("start chromium: %v", err)
	}
}

type consoleLog struct {
	mu      sync.Mutex
	lines   []string
	cut     map[string]bool // URLs whose answers the test cut (cutOnce)
	changes int             // requests Chromium aborted for a network change (net::ERR_NETWORK_CHANGED)
}

func (c *consoleLog) wasCut(url string) bool { c.mu.Lock(); defer c.mu.Unlock(); return c.cut[url] }

// cutOnce has Chromium fail the first request of ctx's tab whose URL ends with suffix once the server has
// answered it, as Chromium fails a call whose connection it drops for a network change (ERR_NETWORK_CHANGED,
// which a fork's own new veths can cause) after the server did it. Until the returned function runs, every other
// such request goes through.
func cutOnce(t *testing.T, ctx context.Context, cl *consoleLog, suffix string) (stop func()) {
	t.Helper()
	var once sync.Once
	tab := cdp.WithExecutor(ctx, chromedp.FromContext(ctx).Target)
	chromedp.ListenTarget(ctx, func(ev any) {
		e, ok := ev.(*fetch.EventRequestPaused)
		if !ok {
			return
		}
		cut := false
		if strings.HasSuffix(e.Request.URL, suffix) {
			once.Do(func() { cut = true })
		}
		go func() { // not on the listener's goroutine: the call waits for its answer, which comes through it
			var err error
			if cut {
				cl.mu.Lock()
				cl.cut[e.Request.URL] = true
				cl.mu.Unlock()
				t.Logf("cutting the answer (%d) to %s", e.ResponseStatusCode, e.Request.URL)
				err = fetch.FailRequest(e.RequestID, network.ErrorReasonConnectionReset).Do(tab)
			} else {
				err = fetch.ContinueRequest(e.RequestID).Do(tab)
			}
			if err != nil && tab.Err() == nil {
				t.Errorf("intercepted %s: %v", e.Request.URL, err)
			}
		}()
	})
	pattern := &fetch.RequestPattern{URLPattern: "*" + suffix, RequestStage: fetch.RequestStageResponse}
	if err := chromedp.Run(ctx, fetch.Enable().WithPatterns([]*fetch.RequestPattern{pattern})); err != nil {
		t.Fatalf("intercept %s: %v", suffix, err)
	}
	return func() {
		if err := chromedp.Run(ctx, fetch.Disable()); err != nil {
			t.Errorf("stop intercepting %s: %v", suffix, err)
		}
	}
}

func (c *consoleLog) add(s string) { c.mu.Lock(); c.lines = append(c.lines, s); c.mu.Unlock() }

// mark is where the log stands: how many lines it holds and how many network changes it has seen.
func (c *consoleLog) mark() (lines, changes int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.lines), c.changes
}

// dropSince removes and returns the lines logged since mark's lines, if a network change was seen since mark's
// changes: they are what a page does once the network cut its own scripts (e.g. "keyCache is not defined" when
// core.js never arrived), not the console's errors. Otherwise it leaves the log as it is and returns nil.
func (c *consoleLog) dropSince(lines, changes int) []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.changes == changes {
		return nil
	}
	dropped := append([]string(nil), c.lines[lines:]...)
	c.lines = c.lines[:lines]
	return dropped
}

func (c *consoleLog) all() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), c.lines...)
}

// artifacts is where screenshots go.
func artifacts(t *testing.T) string {
	dir := os.Getenv("RAMIFY_TEST_ARTIFACTS")
	if dir == "" {
		return t.TempDir()
	}
	dir = filepath.Join(dir, "console")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	return dir
}

func shot(t *testing.T, dir, name string) chromedp.Action {
	return chromedp.ActionFunc(func(ctx context.Context) error {
		// The page as it settles: after the tree's transitions (a node moving out of or into its parent) end.
		if err := chromedp.Poll(`document.getAnimations().length === 0`, nil).Do(ctx); err != nil {
			return err
		}
		var png []byte
		if err := chromedp.FullScreenshot(&png, 100).Do(ctx); err != nil {
			return err
		}
		p := filepath.Join(dir, name+".png")
		t.Logf("screenshot %s", p)
		return os.WriteFile(p, png, 0o644)
	})
}

// load opens url and waits for ready. Chromium aborts loads in flight when the host's network interfaces change
// (net::ERR_NETWORK_CHANGED), as they do whenever any server on the host (other packages' tests run at the same
// time) adds a sandbox's veth: a page whose own scripts were cut that way never becomes ready, so the load is
// retried from a blank page (a navigation that changes only the URL's fragment would not reload it).
func load(t *testing.T, ctx context.Context, cl *consoleLog, url, ready string) {
	t.Helper()
	for attempt := 1; ; attempt++ {
		lines, changes := cl.mark()
		lctx, cancel := context.WithTimeout(ctx, 20*time.Second)
		err := chromedp.Run(lctx, chromedp.Navigate("about:blank"), chromedp.Navigate(url), chromedp.WaitVisible(ready))
		cancel()
		if err == nil {
			return
		}
		// The errors of a load the network broke are not the console's; those of a load that failed without a
		// network change stay in the log, and fail the test at its end even if a later attempt succeeds.
		for _, l := range cl.dropSince(lines, changes) {
			t.Logf("load %s, attempt %d, cut by a network change: %s", url, attempt, l)
		}
		if attempt == 5 {
			t.Fatalf("load %s: %v\nconsole:\n  %s", url, err, strings.Join(cl.all(), "\n  "))
		}
		t.Logf("load %s, attempt %d: %v; again", url, attempt, err)
	}
}

// step runs actions, each step given a minute (a real server's fork or pause takes well under that).
func step(t *testing.T, ctx context.Context, what string, actions ...chromedp.Action) {
	t.Helper()
	sctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := chromedp.Run(sctx, actions...); err != nil {
		var html string
		chromedp.Run(ctx, chromedp.OuterHTML("main", &html)) //nolint:errcheck // for the failure message only
		t.Fatalf("%s: %v\npage:\n%s", what, err, html)
	}
}

func readFile(t *testing.T, srv *testserver.Server, id, path string) string {
	t.Helper()
	rc, err := srv.Client.ReadFile(context.Background(), id, path)
	if err != nil {
		t.Fatalf("read %s of %s: %v", path, id, err)
	}
	defer rc.Close()
	b, err := io.ReadAll(rc)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func node(id string) string { return fmt.Sprintf(`svg.tree g.node[data-id=%q]`, id) }

func TestConsole(t *testing.T) {
	bin := chromium(t)
	// No warm pool: its background creates add veths, and Chromium aborts loads in flight when interfaces change
	// (net::ERR_NETWORK_CHANGED), which could cut the console's own scripts as the page loads.
	srv := testserver.Start(t, "--warm-pool", "0")
	bg := context.Background()
	parent, err := srv.Client.Create(bg, client.CreateRequest{Metadata: map[string]string{"suite": "console"}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := srv.Client.Exec(bg, parent.ID, client.ExecRequest{Cmd: "printf 'one\\ntwo\\nthree\\n' > /root/notes.txt"}); err != nil {
		t.Fatal(err)
	}
	ctx, console := browser(t)
	t.Logf("chromium %s", bin)
	dir := artifacts(t)

	// Sign in with the form; the list shows the sandbox with its metadata.
	load(t, ctx, console, srv.URL+"/ui/", `#signin #key`)
	step(t, ctx, "sign in",
		chromedp.SendKeys(`#key`, srv.Key),
		chromedp.Click(`#signin button[type=submit]`),
		chromedp.WaitVisible(fmt.Sprintf(`tr[data-id=%q]`, parent.ID)),
		chromedp.WaitVisible(`#live.on`),
		shot(t, dir, "sandboxes"))
	row := fmt.Sprintf(`tr[data-id=%q]`, parent.ID)
	step(t, ctx, "filter by metadata",
		chromedp.SendKeys(`#filter`, "suite=other"),
		chromedp.WaitNotPresent(row),
		chromedp.SetValue(`#filter`, "suite=console"),
		chromedp.SendKeys(`#filter`, " "),
		chromedp.WaitVisible(row))

	// The fork tree: the parent alone, then a fork made by another client fans out live.
	step(t, ctx, "open the tree",
		chromedp.Navigate(srv.URL+"/ui/#/tree/"+parent.FamilyID),
		chromedp.WaitVisible(node(parent.ID)))
	kids, err := srv.Client.Fork(bg, parent.ID, 2)
	if err != nil {
		t.Fatal(err)
	}
	step(t, ctx, "see the fork live", chromedp.WaitVisible(node(kids[0])), chromedp.WaitVisible(node(kids[1])))
	if _, _, err := srv.Client.Pause(bg, kids[1]); err != nil {
		t.Fatal(err)
	}
	step(t, ctx, "see a child paused", chromedp.WaitVisible(node(kids[1])+`.st-paused`), shot(t, dir, "tree"))

	// Clicking a node opens the sandbox; run a cell and a command there.
	step(t, ctx, "open a child from the tree", chromedp.Click(node(kids[0])), chromedp.WaitVisible(`#code`))
	// The cell shows its output, a rich result (an SVG display) as an image, and its value. chromedp types
	// newlines as Enter: the textarea takes them as they come, so the code is typed unindented.
	cell := "class Dot:\n" +
		"  def _repr_svg_(self): return '<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"40\" height=\"40\"><circle cx=\"20\" cy=\"20\" r=\"15\" fill=\"teal\"/></svg>'\n" +
		"\ndisplay(Dot())\nx = 41\nprint('hello from the console')\nx + 1"
	step(t, ctx, "run a cell",
		chromedp.SendKeys(`#code`, cell),
		chromedp.Click(`#run`),
		chromedp.WaitVisible(`#code-out pre.value`))
	var value, stdout, img string
	var ok bool
	step(t, ctx, "read the cell", chromedp.Text(`#code-out pre.value`, &value), chromedp.Text(`#code-out pre.stdout`, &stdout),
		chromedp.AttributeValue(`#code-out .result[data-type=display_data] img`, "src", &img, &ok))
	if value != "42" || !strings.Contains(stdout, "hello from the console") || !strings.HasPrefix(img, "data:image/svg+xml;base64,") {
		t.Fatalf("cell answered value %q, stdout %q, image %.40q", value, stdout, img)
	}
	step(t, ctx, "run a command",
		chromedp.SendKeys(`#cmd`, "printf 'one\\n2\\nthree\\nfour\\n' > /root/notes.txt && echo done"),
		chromedp.Click(`#cmd + button`),
		chromedp.WaitVisible(`#cmd-out pre.stdout`))
	var out string
	step(t, ctx, "read the command", chromedp.Text(`#cmd-out`, &out))
	if !strings.Contains(out, "exit 0") || !strings.Contains(out, "done") {
		t.Fatalf("command output %q", out)
	}
	step(t, ctx, "list files", chromedp.Click(`#dir + button`), chromedp.WaitVisible(`//td/span[text()="notes.txt"]`, chromedp.BySearch), shot(t, dir, "sandbox"))
	up := filepath.Join(t.TempDir(), "uploaded.txt")
	if err := os.WriteFile(up, []byte("from the browser\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	step(t, ctx, "upload a file",
		chromedp.SetUploadFiles(`#upload`, []string{up}, chromedp.ByQuery),
		chromedp.WaitVisible(`//td/span[text()="uploaded.txt"]`, chromedp.BySearch))
	if got := readFile(t, srv, kids[0], "/root/uploaded.txt"); got != "from the browser\n" {
		t.Fatalf("uploaded file holds %q", got)
	}

	// The diff of the parent and the child, and the changed file's line diff.
	step(t, ctx, "open the diff",
		chromedp.Navigate(srv.URL+"/ui/#/diff/"+parent.ID+"/"+kids[0]),
		chromedp.WaitVisible(`.dcol.modified button[data-path="/root/notes.txt"]`),
		chromedp.Click(`.dcol.modified button[data-path="/root/notes.txt"]`),
		chromedp.WaitVisible(`pre.linediff span.add`))
	var added, removed string
	step(t, ctx, "read the line diff",
		chromedp.Text(`pre.linediff`, &added),
		chromedp.Text(`pre.linediff span.del`, &removed),
		shot(t, dir, "diff"))
	if !strings.Contains(added, "+ 2") || !strings.Contains(added, "+ four") || strings.TrimSpace(removed) != "- two" {
		t.Fatalf("line diff:\n%s\n(removed %q)", added, removed)
	}

	// A second tab, signed in by the #key= link, watches the tree while the first merges the child into its
	// parent from the sandbox page: the console moves to the parent, and the watching tree loses the child live.
	tab, closeTab := chromedp.NewContext(ctx)
	defer closeTab()
	listen(t, tab, console)
	load(t, tab, console, srv.URL+"/ui/#key="+srv.Key, fmt.Sprintf(`tr[data-id=%q]`, parent.ID)) // signed in by the link
	step(t, tab, "open the tree in the tab signed in by link",
		chromedp.Navigate(srv.URL+"/ui/#/tree/"+parent.FamilyID),
		chromedp.WaitVisible(node(kids[0])),
		chromedp.WaitVisible(`#live.on`))
	var url string
	step(t, tab, "the link's key leaves the address bar", chromedp.Location(&url))
	if strings.Contains(url, srv.Key) {
		t.Errorf("the key stayed in the URL: %s", url)
	}
	step(t, ctx, "merge from the UI",
		chromedp.Navigate(srv.URL+"/ui/#/sb/"+kids[0]),
		chromedp.WaitVisible(`#merge-up`),
		chromedp.Click(`#merge-up`),
		chromedp.WaitVisible(`#code`),
		chromedp.WaitVisible(fmt.Sprintf(`//h1[text()=%q]`, parent.ID), chromedp.BySearch))
	step(t, tab, "see the tree change live",
		chromedp.WaitNotPresent(node(kids[0])),
		chromedp.WaitVisible(node(parent.ID)),
		chromedp.WaitVisible(node(kids[1])),
		chromedp.WaitVisible(`//ol[@class="evlog"]/li[contains(., "merged")]`, chromedp.BySearch),
		shot(t, dir, "tree-merged"))
	if got := readFile(t, srv, parent.ID, "/root/notes.txt"); got != "one\n2\nthree\nfour\n" {
		t.Fatalf("after the merge the parent's notes.txt is %q, want the child's", got)
	}

	// The sandbox page's buttons, watched by the tree in the other tab: fork the parent (now the merged
	// winner's state) in three, pause and resume a new child, delete the paused child (the button asks twice).
	// The fork makes its children's veths, and Chromium may cut the fork's own request for that network change
	// (as it cuts others'). Here the test cuts it, after the server forked: the console tries it again with its
	// idempotency key, the server answers with the fork it made, and there is one fork, not two.
	// The count typed is still there after the page's reload (every 4 s), which redraws the actions only when
	// what they offer changed.
	stopCut := cutOnce(t, ctx, console, "/v1/sandboxes/"+parent.ID+"/fork")
	step(t, ctx, "fork 3 from the UI (its answer cut once)",
		chromedp.SetValue(`#fork-n`, "3"),
		chromedp.Sleep(4500*time.Millisecond),
		chromedp.Click(`#fork`),
		chromedp.WaitReady(`//div[@id="toast"][starts-with(., "forked: ")]`, chromedp.BySearch))
	stopCut()
	if !console.wasCut(srv.URL + "/v1/sandboxes/" + parent.ID + "/fork") {
		t.Errorf("the fork's answer was not cut: the console's retry was not tried")
	}
	all, err := srv.Client.List(bg, client.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	var fresh []string
	for _, sb := range all {
		if sb.ParentID == parent.ID && sb.ID != kids[1] {
			fresh = append(fresh, sb.ID)
		}
	}
	if len(fresh) != 3 {
		t.Fatalf("after a fork of 3 from the UI the parent has new children %v", fresh)
	}
	step(t, tab, "see the UI's fork live", chromedp.WaitVisible(node(fresh[0])), chromedp.WaitVisible(node(fresh[1])), chromedp.WaitVisible(node(fresh[2])))
	step(t, ctx, "pause and resume from the UI",
		chromedp.Navigate(srv.URL+"/ui/#/sb/"+fresh[0]),
		chromedp.WaitVisible(`#pause`),
		chromedp.Click(`#pause`),
		chromedp.WaitVisible(`#resume`))
	step(t, tab, "see the pause live", chromedp.WaitVisible(node(fresh[0])+`.st-paused`))
	step(t, ctx, "resume", chromedp.Click(`#resume`), chromedp.WaitVisible(`#pause`))
	step(t, tab, "see the resume live", chromedp.WaitVisible(node(fresh[0])+`.st-running`))
	step(t, ctx, "delete from the UI",
		chromedp.Navigate(srv.URL+"/ui/#/sb/"+kids[1]),
		chromedp.WaitVisible(`#delete`),
		chromedp.Click(`#delete`),
		chromedp.WaitVisible(`//button[@id="delete"][text()="Really delete?"]`, chromedp.BySearch),
		chromedp.Click(`#delete`),
		chromedp.WaitVisible(fmt.Sprintf(`//h1[text()=%q]`, parent.ID), chromedp.BySearch))
	step(t, tab, "see the delete live", chromedp.WaitNotPresent(node(kids[1])), shot(t, dir, "tree-after"))

	if errs := console.all(); len(errs) > 0 {
		t.Fatalf("the console logged errors:\n  %s", strings.Join(errs, "\n  "))
	}
}

// Output of sandbox code is inert in the console: a cell's HTML result with scripts and event handlers, an SVG
// result with a script and an onload handler, and Markdown with a script run nothing in the page that holds the
// key (HTML goes in a frame sandboxed without scripts, SVG is an image, Markdown is text; the page's
// Content-Security-Policy allows only the console's own files).
func TestConsoleKeepsSandboxOutputInert(t *testing.T) {
	chromium(t)
	// No warm pool: its background creates add veths, and Chromium aborts loads in flight when interfaces change
	// (net::ERR_NETWORK_CHANGED), here the console's own scripts.
	srv := testserver.Start(t, "--warm-pool", "0")
	sb, err := srv.Client.Create(context.Background(), client.CreateRequest{Metadata: map[string]string{"suite": "console-attack"}})
	if err != nil {
		t.Fatal(err)
	}
	ctx, console := browser(t)
	attack := "from IPython.display import HTML, SVG, Markdown\n" +
		"display(HTML('<b id=inside>html result</b><script>top.__pwned = 1; top.sessionStorage.clear()</script>'" +
		" '<svg onload=\"top.__pwned = 2\"></svg>'))\n" +
		"display(SVG('<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"10\" height=\"10\" onload=\"top.__pwned = 3\">'" +
		" '<script>top.__pwned = 4</script><circle r=\"5\"/></svg>'))\n" +
		"display(Markdown('<script>top.__pwned = 5</script>**md**'))\n" +
		"'attacked'"
	load(t, ctx, console, srv.URL+"/ui/#key="+srv.Key, `#live.on`)
	step(t, ctx, "open the sandbox",
		chromedp.Navigate(srv.URL+"/ui/#/sb/"+sb.ID),
		chromedp.WaitVisible(`#code`))
	// The run's request can be cut by Chromium when the host's interfaces change (another package's servers add
	// veths as this runs): "Failed to fetch", and the run is made again; any other outcome is the test's.
	for attempt := 1; ; attempt++ {
		var cut bool
		step(t, ctx, "run the attacking cell",
			chromedp.SetValue(`#code`, attack),
			chromedp.Click(`#run`),
			chromedp.WaitVisible(`#code-out pre.value, #code-out pre.err`, chromedp.ByQuery),
			chromedp.Evaluate(`!document.querySelector('#code-out pre.value') &&
				document.querySelector('#code-out pre.err').textContent === 'Failed to fetch'`, &cut))
		if !cut {
			break
		}
		if attempt == 3 {
			t.Fatal("run the attacking cell: its request was cut three times")
		}
		t.Logf("run the attacking cell, attempt %d: its request was cut (Failed to fetch); again", attempt)
	}
	step(t, ctx, "see the attacking cell's value", chromedp.WaitVisible(`#code-out pre.value`))
	var pwned bool
	var keys int
	var frameSandbox string
	var framed bool
	step(t, ctx, "look for its effects",
		chromedp.Sleep(500*time.Millisecond), // an onload or a late script would have run by now
		chromedp.Evaluate(`window.__pwned !== undefined`, &pwned),
		chromedp.Evaluate(`sessionStorage.length`, &keys),
		chromedp.AttributeValue(`#code-out .result iframe`, "sandbox", &frameSandbox, &framed))
	if pwned || keys == 0 {
		t.Fatalf("sandbox output ran in the console: __pwned set %v, sessionStorage keys %d", pwned, keys)
	}
	if !framed || frameSandbox != "" {
		t.Fatalf("the HTML result is not in a frame sandboxed without scripts (sandbox=%q, present %v)", frameSandbox, framed)
	}
	for _, l := range console.all() {
		// The browser reporting that it refused the sandbox's scripts is the defence at work.
		if strings.Contains(l, "Blocked script execution") || strings.Contains(l, "Content Security Policy") {
			t.Logf("refused, as it should be: %s", l)
			continue
		}
		t.Errorf("console: %s", l)
	}
}
