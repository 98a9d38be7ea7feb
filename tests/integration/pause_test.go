package integration

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/ramify-dev/ramify/client"
	"github.com/ramify-dev/ramify/internal/testserver"
)

const sessionSetup = `import pandas as pd, numpy as np, socket, os
df = pd.DataFrame({"a": np.arange(1000), "b": np.arange(1000) * 2.5})
def score(frame, k=3):
    return float(frame.b.sum()) * k
class Model:
    def __init__(self, w):
        self.w = w
    def predict(self, x):
        return self.w * x
m = Model(7)
counter = 41
os.chdir("/srv")
os.environ["STAGE"] = "two"
sock = socket.socket()
1`

func pauseAndWait(t *testing.T, s *testserver.Server, id string) *client.Sandbox {
	t.Helper()
	ctx := ctxT(t)
	sb, after, err := s.Client.Pause(ctx, id)
	if err != nil {
		t.Fatalf("pause: %v", err)
	}
	if sb.Status != "pausing" && sb.Status != "paused" {
		t.Fatalf("pause answered status %q", sb.Status)
	}
	if sb.Status == "pausing" && after <= 0 {
		t.Errorf("pause gave no X-Poll-After")
	}
	sb, err = s.Client.WaitStatus(ctx, id, "paused")
	if err != nil {
		t.Fatalf("wait paused: %v (%+v)", err, sb)
	}
	return sb
}

func resumeAndWait(t *testing.T, s *testserver.Server, id string) *client.Sandbox {
	t.Helper()
	ctx := ctxT(t)
	if _, _, err := s.Client.Resume(ctx, id); err != nil {
		t.Fatalf("resume: %v", err)
	}
	sb, err := s.Client.WaitStatus(ctx, id, "running")
	if err != nil {
		t.Fatalf("wait running: %v (%+v)", err, sb)
	}
	return sb
}

func TestPauseResumeRoundTrip(t *testing.T) {
	s := testserver.Start(t)
	ctx := ctxT(t)
	id := create(t, s, &client.CreateRequest{Metadata: map[string]string{"k": "v"}})
	sh(t, s, id, "mkdir -p /srv /root/data && head -c 3000000 /dev/urandom > /root/data/blob && echo hello > /srv/note.txt && rm -f /etc/motd && sleep 1000 >/dev/null 2>&1 &")
	value(t, s, id, sessionSetup)
	blobSum := sh(t, s, id, "sha256sum /root/data/blob").Stdout

	sb := pauseAndWait(t, s, id)
	if sb.Pause == nil || sb.Pause.SnapshotBytes < 3000000 {
		t.Fatalf("pause info: %+v", sb.Pause)
	}
	notSaved := fmt.Sprint(sb.Pause.NotSaved)
	if !strings.Contains(notSaved, "sock") || !strings.Contains(notSaved, "sleep 1000") {
		t.Errorf("not_saved should name the socket and the background process: %s", notSaved)
	}
	// Paused: no processes, calls refused with 409, pause is idempotent.
	if _, err := s.Client.RunCode(ctx, id, client.RunCodeRequest{Code: "1"}); !errors.Is(err, client.ErrConflict) {
		t.Fatalf("run_code on paused: %v", err)
	}
	code, body := raw(t, s, "POST", "/v1/sandboxes/"+id+"/pause", s.Key, nil)
	if code != 200 || body["status"] != "paused" {
		t.Fatalf("second pause: %d %v", code, body)
	}
	if err := killSandboxProcesses(id); err == nil {
		t.Fatalf("a paused sandbox still has processes")
	}

	sb = resumeAndWait(t, s, id)
	if sb.Metadata["k"] != "v" {
		t.Errorf("metadata lost: %+v", sb.Metadata)
	}
	code, body = raw(t, s, "POST", "/v1/sandboxes/"+id+"/resume", s.Key, nil)
	if code != 200 || body["status"] != "running" {
		t.Fatalf("second resume: %d %v", code, body)
	}
	if v := value(t, s, id, "(counter + 1, score(df), m.predict(6), type(m).__name__, os.getcwd(), os.environ['STAGE'], df.shape)"); v != "(42, 3746250.0, 42, 'Model', '/srv', 'two', (1000, 2))" {
		t.Fatalf("session after resume: %s", v)
	}
	if ex := run(t, s, id, "sock"); ex.Error == nil || ex.Error.Name != "NameError" {
		t.Errorf("the unsaved socket should be gone: %+v", ex)
	}
	if r := sh(t, s, id, "sha256sum /root/data/blob; cat /srv/note.txt; test -e /etc/motd && echo motd-back || echo motd-gone; ls -a / | grep -c ramify-session"); r.Stdout != blobSum+"hello\nmotd-gone\n0\n" {
		t.Fatalf("files after resume: %q", r.Stdout)
	}
	// Paused sandboxes can be deleted, taking their snapshot with them (in the background: the DELETE answers
	// once the record is gone).
	pauseAndWait(t, s, id)
	if err := s.Client.Delete(ctx, id); err != nil {
		t.Fatal(err)
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		left, _ := filepath.Glob(filepath.Join(s.DataDir, "snapshots", "objects", id, "*"))
		if len(left) == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("snapshot left after delete: %v", left)
		}
	}
}

func TestPausedSandboxSurvivesRestartAndForks(t *testing.T) {
	s := testserver.Start(t)
	ctx := ctxT(t)
	id := create(t, s, nil)
	value(t, s, id, "x = [1, 2, 3]; 1")
	sh(t, s, id, "echo kept > /root/f.txt")
	pauseAndWait(t, s, id)
	s.Kill()
	s.Restart()
	info, err := s.Client.Get(ctx, id)
	if err != nil || info.Status != "paused" {
		t.Fatalf("after restart: %+v %v", info, err)
	}
	// Fork of a paused sandbox: start_paused keeps the child paused; by default it resumes.
	var res struct {
		Children []string `json:"children"`
	}
	if err := s.PostJSON(ctx, "/v1/sandboxes/"+id+"/fork", map[string]any{"start_paused": true}, &res); err != nil || len(res.Children) != 1 {
		t.Fatalf("fork paused: %v %+v", err, res)
	}
	kept := res.Children[0]
	kinfo, _ := s.Client.Get(ctx, kept)
	if kinfo.Status != "paused" || kinfo.ForkedFrom != id || kinfo.IP == info.IP {
		t.Fatalf("start_paused child: %+v", kinfo)
	}
	kids, err := s.Client.Fork(ctx, id, 1)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Client.WaitStatus(ctx, kids[0], "running"); err != nil {
		t.Fatal(err)
	}
	if v := value(t, s, kids[0], "x + [4]"); v != "[1, 2, 3, 4]" {
		t.Fatalf("fork of paused: %s", v)
	}
	value(t, s, kids[0], "x.append(99); 1")
	resumeAndWait(t, s, id)
	if v := value(t, s, id, "x"); v != "[1, 2, 3]" {
		t.Fatalf("original after its fork changed: %s", v)
	}
	if r := sh(t, s, id, "cat /root/f.txt"); r.Stdout != "kept\n" {
		t.Fatalf("file: %q", r.Stdout)
	}
	resumeAndWait(t, s, kept)
	if v := value(t, s, kept, "x"); v != "[1, 2, 3]" {
		t.Fatalf("start_paused child after resume: %s", v)
	}
}

func TestResumeWithCorruptOrMissingSnapshot(t *testing.T) {
	s := testserver.Start(t)
	ctx := ctxT(t)
	id := create(t, s, nil)
	// A large array travels as a raw buffer, read with direct I/O on resume: corrupt its bytes too.
	value(t, s, id, "import numpy as np\nv = 'precious'\nbig = np.arange(1 << 20)\n1")
	pauseAndWait(t, s, id)
	for _, name := range []string{"layer.tar", "session.bin"} {
		parts, _ := filepath.Glob(filepath.Join(s.DataDir, "snapshots", "objects", id, "*", name))
		if len(parts) != 1 {
			t.Fatalf("snapshot %s parts: %v", name, parts)
		}
		orig, err := os.ReadFile(parts[0])
		if err != nil {
			t.Fatal(err)
		}
		// Inside the data; inside a record header; one byte more at the end, after the stream's last record.
		for _, where := range []int{len(orig) / 2, 20, len(orig)} {
			bad := append([]byte(nil), orig...)
			if where == len(orig) {
				bad = append(bad, 0)
			} else {
				bad[where] ^= 0xff
			}
			os.WriteFile(parts[0], bad, 0o600)

			s.Client.Resume(ctx, id)
			sb, err := s.Client.WaitStatus(ctx, id, "running")
			var se *client.StatusError
			if !errors.As(err, &se) || !strings.Contains(sb.Error, "corrupt") {
				t.Fatalf("resume with %s corrupt at %d: %+v %v", name, where, sb, err)
			}
			if now, _ := os.ReadFile(parts[0]); sha(now) != sha(bad) {
				t.Fatalf("the failed resume touched %s", name)
			}
		}
		// Missing part.
		os.Rename(parts[0], parts[0]+".away")
		s.Client.Resume(ctx, id)
		sb, err := s.Client.WaitStatus(ctx, id, "running")
		var se *client.StatusError
		if !errors.As(err, &se) || !strings.Contains(sb.Error, "missing") {
			t.Fatalf("resume with %s missing: %+v %v", name, sb, err)
		}
		os.Rename(parts[0]+".away", parts[0])
		os.WriteFile(parts[0], orig, 0o600)
	}
	// Repaired, the resume works: nothing was lost.
	resumeAndWait(t, s, id)
	if v := value(t, s, id, "v, int(big.sum())"); v != fmt.Sprintf("('precious', %d)", (1<<20)*((1<<20)-1)/2) {
		t.Fatalf("after repaired resume: %s", v)
	}
}

// A snapshot an earlier version made names its parts' SHA-256, not their CRC-32C: it resumes, its interpreter
// checking the session file as it reads it in that algorithm, and a corrupt part of it is told as corrupt. The
// next pause writes CRC-32C.
func TestResumeOfAnOlderSnapshot(t *testing.T) {
	s := testserver.Start(t)
	ctx := ctxT(t)
	id := create(t, s, nil)
	value(t, s, id, "import numpy as np\nv = 'precious'\nbig = np.arange(1 << 21)\n1")
	sh(t, s, id, "echo kept > /root/f.txt")
	pauseAndWait(t, s, id)
	manifests, _ := filepath.Glob(filepath.Join(s.DataDir, "snapshots", "objects", id, "*", "manifest.json"))
	if len(manifests) != 1 {
		t.Fatalf("manifests: %v", manifests)
	}
	b, err := os.ReadFile(manifests[0])
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	parts := m["parts"].(map[string]any)
	for name, p := range parts {
		part := p.(map[string]any)
		if c, _ := part["crc32c"].(string); len(c) != 8 || part["sha256"] != nil {
			t.Fatalf("part %s of a new snapshot: %v, want a crc32c only", name, part)
		}
		data, err := os.ReadFile(filepath.Join(filepath.Dir(manifests[0]), name))
		if err != nil {
			t.Fatal(err)
		}
		delete(part, "crc32c")
		part["sha256"] = sha(data)
	}
	older, _ := json.MarshalIndent(m, "", "  ")
	if err := os.WriteFile(manifests[0], older, 0o600); err != nil {
		t.Fatal(err)
	}
	// Corrupt under the older manifest: the interpreter's SHA-256 of what it read tells it.
	session := filepath.Join(filepath.Dir(manifests[0]), "session.bin")
	orig, err := os.ReadFile(session)
	if err != nil {
		t.Fatal(err)
	}
	bad := append([]byte(nil), orig...)
	bad[len(bad)/2] ^= 0xff
	os.WriteFile(session, bad, 0o600)
	s.Client.Resume(ctx, id)
	sb, err := s.Client.WaitStatus(ctx, id, "running")
	var se *client.StatusError
	if !errors.As(err, &se) || !strings.Contains(sb.Error, "corrupt") || !strings.Contains(sb.Error, "sha256") {
		t.Fatalf("resume of an older snapshot with session.bin corrupt: %+v %v", sb, err)
	}
	os.WriteFile(session, orig, 0o600)
	resumeAndWait(t, s, id)
	if v := value(t, s, id, "v, int(big.sum())"); v != fmt.Sprintf("('precious', %d)", (1<<21)*((1<<21)-1)/2) {
		t.Fatalf("after the resume of an older snapshot: %s", v)
	}
	if r := sh(t, s, id, "cat /root/f.txt"); r.Stdout != "kept\n" {
		t.Fatalf("file: %q", r.Stdout)
	}
	pauseAndWait(t, s, id)
	manifests, _ = filepath.Glob(filepath.Join(s.DataDir, "snapshots", "objects", id, "*", "manifest.json"))
	if len(manifests) != 1 {
		t.Fatalf("manifests after the next pause: %v", manifests)
	}
	if b, _ := os.ReadFile(manifests[0]); !strings.Contains(string(b), `"crc32c"`) || strings.Contains(string(b), `"sha256"`) {
		t.Fatalf("the next pause's manifest: %s", b)
	}
	resumeAndWait(t, s, id)
	if v := value(t, s, id, "v"); v != "'precious'" {
		t.Fatalf("after the next resume: %s", v)
	}
}

func sha(b []byte) string { h := sha256.Sum256(b); return hex.EncodeToString(h[:]) }

func TestPauseRacesStayConsistent(t *testing.T) {
	s := testserver.Start(t)
	ctx := ctxT(t)
	for round, racer := range []string{"exec", "fork", "destroy", "merge"} {
		id := create(t, s, nil)
		value(t, s, id, fmt.Sprintf("r = %d; 1", round))
		var kid string
		if racer == "merge" {
			kids, err := s.Client.Fork(ctx, id, 1)
			if err != nil {
				t.Fatal(err)
			}
			kid = kids[0]
		}
		done := make(chan error, 1)
		go func() {
			c, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			var err error
			switch racer {
			case "exec":
				_, err = s.Client.Exec(c, id, client.ExecRequest{Cmd: "echo hi"})
			case "fork":
				_, err = s.Client.Fork(c, id, 1)
			case "destroy":
				err = s.Client.Delete(c, id)
			case "merge":
				err = s.Client.MergeInto(c, id, kid)
			}
			done <- err
		}()
		_, _, perr := s.Client.Pause(ctx, id)
		rerr := <-done
		// Whatever the order, the end state is one of the legal ones and the sandbox works after a resume.
		info, gerr := s.Client.Get(ctx, id)
		if racer == "destroy" && errors.Is(gerr, client.ErrNotFound) {
			continue
		}
		if gerr != nil {
			t.Fatalf("%s: get: %v (pause %v, racer %v)", racer, gerr, perr, rerr)
		}
		if info.Status == "pausing" {
			info, _ = s.Client.WaitStatus(ctx, id, "paused")
		}
		if info.Status == "paused" {
			resumeAndWait(t, s, id)
		}
		if v := value(t, s, id, "r"); v != fmt.Sprint(round) {
			t.Fatalf("%s: state after race: %s", racer, v)
		}
	}
}

func TestPauseResumeSoak(t *testing.T) {
	cycles := 200
	if testing.Short() {
		cycles = 20
	}
	s := testserver.Start(t)
	id := create(t, s, nil)
	value(t, s, id, "import hashlib\nstate = {'n': 0, 'blob': bytes(range(256)) * 4096}\n1")
	sh(t, s, id, "mkdir -p /root/soak && for i in $(seq 1 50); do head -c $((i * 1000)) /dev/urandom > /root/soak/f$i; done")
	want := sh(t, s, id, "cd /root/soak && sha256sum * | sha256sum").Stdout
	start := time.Now()
	for i := 1; i <= cycles; i++ {
		pauseAndWait(t, s, id)
		resumeAndWait(t, s, id)
		if got := sh(t, s, id, "cd /root/soak && sha256sum * | sha256sum").Stdout; got != want {
			t.Fatalf("cycle %d: files changed: %q != %q", i, got, want)
		}
		if v := value(t, s, id, "state['n'] += 1; (state['n'], hashlib.sha256(state['blob']).hexdigest()[:12])"); v != fmt.Sprintf("(%d, 'fbbab289f7f9')", i) {
			t.Fatalf("cycle %d: variables: %s", i, v)
		}
	}
	t.Logf("%d pause/resume cycles in %s", cycles, time.Since(start))
}

// TestResumedArraysForkCopyOnWrite: arrays restored from a snapshot live in memory of the interpreter's own; a
// fork of the resumed sandbox must still give each child a copy-on-write copy, and writes to it must stay
// fast (the memory must be ordinary private memory, not shared memory that children would write through).
func TestResumedArraysForkCopyOnWrite(t *testing.T) {
	s := testserver.Start(t)
	ctx := ctxT(t)
	id := create(t, s, nil)
	value(t, s, id, "import numpy as np\nbig = np.full(8 << 20, 7, dtype=np.uint8)\nsmall = np.arange(10)\n1")
	pauseAndWait(t, s, id)
	resumeAndWait(t, s, id)
	kids, err := s.Client.Fork(ctx, id, 2)
	if err != nil {
		t.Fatal(err)
	}
	value(t, s, kids[0], "big[:] = 1; small[:] = -1; 1")
	for _, sb := range []string{id, kids[1]} {
		if v := value(t, s, sb, "(int(big.sum()), int(small.sum()))"); v != fmt.Sprintf("(%d, 45)", 7*(8<<20)) {
			t.Fatalf("%s sees a sibling's writes to restored arrays: %s", sb, v)
		}
	}
	value(t, s, id, "big[:] = 3; 1")
	if v := value(t, s, kids[1], "int(big.sum())"); v != fmt.Sprint(7*(8<<20)) {
		t.Fatalf("a child sees the parent's later writes to a restored array: %s", v)
	}
}

// TestWaitEndpoint: GET /v1/sandboxes/{id}/wait answers once the status is reached (a pause, a resume), or at its
// timeout with the status then; bad input is 400, an unknown sandbox 404.
func TestWaitEndpoint(t *testing.T) {
	s := testserver.Start(t)
	id := create(t, s, nil)
	value(t, s, id, "x = 41; 1")
	if code, body := raw(t, s, "GET", "/v1/sandboxes/"+id+"/wait?status=paused&timeout_s=0.2", s.Key, nil); code != 200 || body["status"] != "running" {
		t.Fatalf("wait for a status that does not come: %d %v", code, body)
	}
	if code, body := raw(t, s, "POST", "/v1/sandboxes/"+id+"/pause", s.Key, nil); code != 202 {
		t.Fatalf("pause: %d %v", code, body)
	}
	if code, body := raw(t, s, "GET", "/v1/sandboxes/"+id+"/wait?status=paused", s.Key, nil); code != 200 || body["status"] != "paused" {
		t.Fatalf("wait for paused: %d %v", code, body)
	}
	if code, body := raw(t, s, "POST", "/v1/sandboxes/"+id+"/resume", s.Key, nil); code != 202 {
		t.Fatalf("resume: %d %v", code, body)
	}
	if code, body := raw(t, s, "GET", "/v1/sandboxes/"+id+"/wait?status=running&timeout_s=60", s.Key, nil); code != 200 || body["status"] != "running" {
		t.Fatalf("wait for running: %d %v", code, body)
	}
	if v := value(t, s, id, "x + 1"); v != "42" {
		t.Fatalf("after resume: %s", v)
	}
	for path, want := range map[string]int{
		"/v1/sandboxes/" + id + "/wait":                             400,
		"/v1/sandboxes/" + id + "/wait?status=sleeping":             400,
		"/v1/sandboxes/" + id + "/wait?status=paused&timeout_s=-1":  400,
		"/v1/sandboxes/" + id + "/wait?status=paused&timeout_s=abc": 400,
		"/v1/sandboxes/sbx_nope/wait?status=paused":                 404,
	} {
		if code, body := raw(t, s, "GET", path, s.Key, nil); code != want || body["error"] == nil {
			t.Errorf("GET %s: %d %v, want %d with an error", path, code, body, want)
		}
	}
}

// A parent paused while its fork children run on, then resumed, starts a new family; the children's family (its
// init, its cgroup) is still theirs: both the children and the resumed parent fork again, and deleting one side
// leaves the other working.
func TestResumeWhileChildrenRunKeepsFamiliesApart(t *testing.T) {
	s := testserver.Start(t, "--warm-pool", "0")
	ctx := ctxT(t)
	parent := create(t, s, nil)
	value(t, s, parent, "x = 'parent state'")
	kids, err := s.Client.Fork(ctx, parent, 1)
	if err != nil {
		t.Fatal(err)
	}
	pauseAndWait(t, s, parent)
	pinfo := resumeAndWait(t, s, parent)
	kinfo, _ := s.Client.Get(ctx, kids[0])
	if pinfo == nil || kinfo == nil || pinfo.FamilyID == kinfo.FamilyID {
		t.Fatalf("resumed parent and running child share a family: %+v %+v", pinfo, kinfo)
	}
	grandkids, err := s.Client.Fork(ctx, kids[0], 1)
	if err != nil {
		t.Fatalf("fork of the child after its parent's resume: %v", err)
	}
	if v := value(t, s, grandkids[0], "x"); v != "'parent state'" {
		t.Errorf("grandchild: %s", v)
	}
	again, err := s.Client.Fork(ctx, parent, 1)
	if err != nil {
		t.Fatalf("fork of the resumed parent: %v", err)
	}
	if v := value(t, s, again[0], "x"); v != "'parent state'" {
		t.Errorf("resumed parent's child: %s", v)
	}
	for _, id := range append([]string{kids[0]}, grandkids...) {
		if err := s.Client.Delete(ctx, id); err != nil {
			t.Fatal(err)
		}
	}
	if v := value(t, s, again[0], "x"); v != "'parent state'" {
		t.Errorf("after the old family's end: %s", v)
	}
}

// A resume loads plain data (arrays, frames, containers) with the standard unpickler and imports dill only for
// what needs it (functions, classes and instances of the session's own); either way the values come back whole.
func TestResumeImportsDillOnlyWhenNeeded(t *testing.T) {
	s := testserver.Start(t)
	id := create(t, s, nil)
	value(t, s, id, `import numpy as np, pandas as pd, collections, datetime, sys
a = np.arange(1 << 20)
df = pd.DataFrame({"x": np.arange(100), "y": ["s%d" % i for i in range(100)]})
d = {"k": [1, 2.5, "s", b"b", None], "t": (1, 2), "od": collections.OrderedDict(z=1)}
big = ["item %d" % i for i in range(200000)]
when = datetime.date(2026, 11, 23)
1`)
	pauseAndWait(t, s, id)
	resumeAndWait(t, s, id)
	if v := value(t, s, id, "import sys; ('dill' in sys.modules, int(a.sum()), df.y[99], d['k'][2:], d['od']['z'], len(big), big[-1], str(when))"); v != "(False, 549755289600, 's99', ['s', b'b', None], 1, 200000, 'item 199999', '2026-11-23')" {
		t.Fatalf("plain data after resume: %s", v)
	}
	value(t, s, id, `double = lambda x: 2 * x
class Counter:
    def __init__(self):
        self.n = 41
    def inc(self):
        self.n += 1
        return self.n
c = Counter()
named = {"dill": b"__main__", "__builtin__": "dill"}  # names in data: loaded with dill, whole
# What the standard pickler would save otherwise than dill, found deep in a variable after its data went out: the
# variable is saved again by dill (its arrays loaded once, the function by value, the namespace by reference).
mixed = {"arr": np.arange(1 << 18), "f": double, "c": c, "ns": globals(), "m": sys}
# The same after more than the loader collects before it streams a variable (its pickle is dropped part way).
mixed_big = {"s": "x" * 20_000_000, "f": double}
1`)
	pauseAndWait(t, s, id)
	resumeAndWait(t, s, id)
	if v := value(t, s, id, "('dill' in sys.modules, double(21), c.inc(), type(c) is Counter, int(a[-1]), df.shape, named)"); v != "(True, 42, 42, True, 1048575, (100, 2), {'dill': b'__main__', '__builtin__': 'dill'})" {
		t.Fatalf("session's own functions and classes after resume: %s", v)
	}
	if v := value(t, s, id, "(int(mixed['arr'].sum()), mixed['f'](4), mixed['c'].inc(), mixed['ns'] is globals(), mixed['m'] is sys, len(mixed_big['s']), mixed_big['f'](5))"); v != "(34359607296, 8, 42, True, True, 20000000, 10)" {
		t.Fatalf("a variable mixing data and the session's own objects after resume: %s", v)
	}
}

// Deleting a paused fork child while its parent resumes leaves the parent's resume alone. The child's record
// keeps the name of the family it was paused in, the parent's old family; the resumed parent starts a new
// family, which used to take that same name, and the delete, working from the child's record, took the new
// family for the child's and ended it with the resume half done ("sandbox agent is not reachable"). Without
// families started ahead, so that the resume starts its own.
func TestDeleteOfAPausedChildSparesItsParentsResume(t *testing.T) {
	s := testserver.Start(t, "--prestart-families", "0")
	ctx := ctxT(t)
	parent := create(t, s, nil)
	value(t, s, parent, "v = 7")
	for i, delay := range []time.Duration{0, 20 * time.Millisecond, 50 * time.Millisecond, 100 * time.Millisecond} {
		kids, err := s.Client.Fork(ctx, parent, 1)
		if err != nil {
			t.Fatal(err)
		}
		pauseAndWait(t, s, kids[0])
		pauseAndWait(t, s, parent) // its family ends here: the child's record names it
		if _, _, err := s.Client.Resume(ctx, parent); err != nil {
			t.Fatal(err)
		}
		time.Sleep(delay)
		if err := s.Client.Delete(ctx, kids[0]); err != nil {
			t.Fatalf("round %d: delete the paused child: %v", i, err)
		}
		sb, err := s.Client.WaitStatus(ctx, parent, "running")
		if err != nil || sb.Status != "running" {
			t.Fatalf("round %d: the parent's resume, the child deleted %s after it began: %v %+v", i, delay, err, sb)
		}
		if v := value(t, s, parent, "v"); v != "7" {
			t.Fatalf("round %d: the resumed parent's state: %q", i, v)
		}
	}
}

// GET of a sandbox that is pausing or resuming says how far it has got: the part being moved and the bytes so far
// (for a resume, of the snapshot's size), growing as it goes; the field is gone once the sandbox is paused or
// running again.
func TestPauseAndResumeReportProgress(t *testing.T) {
	s := testserver.Start(t, "--fork-ahead", "0")
	ctx, cancel := context.WithTimeout(ctxT(t), 3*time.Minute)
	defer cancel()
	id := create(t, s, &client.CreateRequest{MemMiB: 2048})
	value(t, s, id, "import numpy as np\na = np.random.rand((100 << 20 >> 3) * 6)\n1") // 600 MiB
	// watch polls GET until the sandbox is in want, collecting the progress it reported on the way.
	watch := func(want string) []client.Progress {
		var seen []client.Progress
		for {
			sb, err := s.Client.Get(ctx, id)
			if err != nil {
				t.Fatal(err)
			}
			if sb.Progress != nil {
				if sb.Status != client.StatusPausing && sb.Status != client.StatusResuming {
					t.Fatalf("progress on a sandbox %s: %+v", sb.Status, sb.Progress)
				}
				seen = append(seen, *sb.Progress)
			}
			if sb.Status == want {
				return seen
			}
			if sb.Status != client.StatusPausing && sb.Status != client.StatusResuming {
				t.Fatalf("sandbox went %s: %s %+v", sb.Status, sb.Error, sb.Pause)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	check := func(what string, seen []client.Progress, phases []string, total, moved int64) {
		t.Helper()
		if len(seen) < 3 {
			t.Fatalf("%s: %d progress reports, want several: %+v", what, len(seen), seen)
		}
		at, sawTotal := 0, false
		for i, p := range seen {
			if i > 0 && (p.Bytes < seen[i-1].Bytes || p.ElapsedMs < seen[i-1].ElapsedMs) {
				t.Fatalf("%s: progress went back: %+v then %+v", what, seen[i-1], p)
			}
			for at < len(phases) && phases[at] != p.Phase {
				at++
			}
			if at == len(phases) {
				t.Fatalf("%s: phase %q out of order (want %v): %+v", what, p.Phase, phases, seen)
			}
			// A resume knows the total once it has read the manifest.
			if p.TotalBytes != total && !(total > 0 && p.TotalBytes == 0 && !sawTotal) {
				t.Fatalf("%s: total_bytes %d, want %d: %+v", what, p.TotalBytes, total, seen)
			}
			sawTotal = sawTotal || p.TotalBytes > 0
		}
		if last := seen[len(seen)-1]; last.Bytes < moved {
			t.Errorf("%s: last report %+v: less than %d bytes moved", what, last, moved)
		}
	}
	if _, _, err := s.Client.Pause(ctx, id); err != nil {
		t.Fatal(err)
	}
	check("pause", watch(client.StatusPaused), []string{"session", "files", "commit"}, 0, 500<<20)
	sb, err := s.Client.Get(ctx, id)
	if err != nil || sb.Progress != nil || sb.Pause == nil {
		t.Fatalf("paused sandbox: %+v %v", sb, err)
	}
	if _, _, err := s.Client.Resume(ctx, id); err != nil {
		t.Fatal(err)
	}
	// (From a local store the interpreter reads the session itself: it counts once loaded.)
	check("resume", watch(client.StatusRunning), []string{"files", "session"}, sb.Pause.SnapshotBytes, 0)
	if v := value(t, s, id, "a.shape"); v != "(78643200,)" {
		t.Fatalf("state after the resume: %s", v)
	}
}
