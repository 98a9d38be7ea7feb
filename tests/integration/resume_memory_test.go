package integration

import (
	"context"
	"fmt"
	"os"
	"regexp"
	"strconv"
	"testing"
	"time"

	"github.com/ramify-dev/ramify/client"
	"github.com/ramify-dev/ramify/internal/s3test"
	"github.com/ramify-dev/ramify/internal/testserver"
)

// TestResumeOfALargeVariableFitsItsMemory: a variable that takes most of a sandbox's memory (512 MiB) pauses and
// resumes whole. The interpreter used to collect a variable's whole pickle, join it into one copy and unpickle
// from that: three times the variable's size, so such a sandbox was OOM-killed on every resume attempt. It now
// unpickles a large pickle as it streams: a large bytes payload is read straight into the restored object, a
// pickle of many objects frame by frame, a large str straight into the restored str. From the local store the interpreter reads the stored file; from S3
// (when a test S3 server can be started) a pipe. The resumed interpreter's peak RSS (VmHWM) is logged.
func TestResumeOfALargeVariableFitsItsMemory(t *testing.T) {
	// One 308 MiB bytes object: a single P record of the session stream.
	const bytesSetup = "import os, hashlib\nv = os.urandom(308 << 20)\nwant = (len(v), hashlib.sha256(v).hexdigest())\n1"
	const bytesCheck = "(len(v), hashlib.sha256(v).hexdigest()) == want"
	// A dict of 4 KiB strings, 300 MiB of characters: a pickle of ~4,800 frames.
	const dictSetup = "import os, hashlib\nv = {'k%d' % i: os.urandom(2048).hex() for i in range(75 * 1024)}\n" +
		"def digest(d):\n    h = hashlib.sha256()\n    for k, x in d.items():\n        h.update(k.encode()); h.update(x.encode())\n    return len(d), h.hexdigest()\n" +
		"want = digest(v)\n1"
	const dictCheck = "digest(v) == want"
	// A 300 MiB str (ASCII) and a 20 Mi-character one of two bytes a character: saved from and loaded into
	// their own memory, where UTF-8 encoding and decoding took twice their size (the resume was OOM-killed).
	const strSetup = "import os, hashlib\nv = os.urandom(1 << 20).hex() * 150\nw = '\\u0100' * (20 << 20)\n" +
		"def digest(s):\n    h = hashlib.sha256()\n    for i in range(0, len(s), 1 << 24):\n        h.update(s[i:i + (1 << 24)].encode())\n    return len(s), h.hexdigest()\n" +
		"want = digest(v), digest(w)\n1"
	const strCheck = "(digest(v), digest(w)) == want"
	local := testserver.Start(t)
	check := func(t *testing.T, s *testserver.Server, setup, check string) {
		ctx, cancel := context.WithTimeout(ctxT(t), 4*time.Minute)
		defer cancel()
		id := create(t, s, &client.CreateRequest{MemMiB: 512})
		defer s.Client.Delete(context.Background(), id)
		value(t, s, id, setup)
		pauseAndWait(t, s, id)
		start := time.Now()
		if _, _, err := s.Client.Resume(ctx, id); err != nil {
			t.Fatalf("resume: %v", err)
		}
		if sb, err := s.Client.WaitStatus(ctx, id, "running"); err != nil {
			t.Fatalf("resume of a 512 MiB sandbox holding a ~300 MiB variable: %v (%+v)", err, sb)
		}
		took := time.Since(start)
		if v := value(t, s, id, check); v != "True" {
			t.Fatalf("the variable after resume: %s", v)
		}
		hwm := value(t, s, id, "[l for l in open('/proc/self/status') if l.startswith('VmHWM')][0].split()[1]")
		kib, _ := strconv.Atoi(regexp.MustCompile(`\d+`).FindString(hwm))
		t.Logf("resumed in %s; the interpreter's peak RSS %d MiB", took.Round(time.Millisecond), kib>>10)
	}
	t.Run("bytes", func(t *testing.T) { check(t, local, bytesSetup, bytesCheck) })
	t.Run("dict of strings", func(t *testing.T) { check(t, local, dictSetup, dictCheck) })
	t.Run("str", func(t *testing.T) { check(t, local, strSetup, strCheck) })
	t.Run("bytes from S3", func(t *testing.T) {
		s := testserver.Start(t, "--s3-endpoint", s3test.Endpoint(t), "--s3-bucket", fmt.Sprintf("ramify-it-%d", os.Getpid()),
			"--s3-prefix", "large/", "--s3-access-key", s3test.AccessKey, "--s3-secret-key", s3test.SecretKey)
		check(t, s, bytesSetup, bytesCheck)
	})
}
