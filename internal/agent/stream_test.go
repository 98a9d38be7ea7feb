package agent

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// TestRestoreStreamHashesTheStoredFile runs repl.py's session stream reader with the host's python3: a stream
// given as the stored file is hashed as it is read, every byte in order (small records, padding, a large buffer
// read in pieces side by side, what follows the last record), so the server can check it without reading the
// file again; the values load as they were, with fewer reads in flight when no thread can be started; a stream
// from a pipe has no digest; a file cut short is an error.
func TestRestoreStreamHashesTheStoredFile(t *testing.T) {
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("no python3")
	}
	loop := strings.TrimSuffix(strings.TrimRight(replSource, "\n"), "main()")
	if loop == replSource {
		t.Fatal("repl.py no longer ends with main()")
	}
	script := loop + `
import hashlib, pickle, tempfile

def write(path, big_size, extra=b""):
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    out = _StreamOut(fd)
    values = {"small": "x" * 100, "big": bytearray(os.urandom(big_size)), "after": [1, 2, 3]}
    for name, v in values.items():
        out.record(b"V", name.encode())

        def oob(buf):
            with buf.raw() as m:
                if m.nbytes < 1 << 16:
                    return True
                out.direct(b"B", m)
            return False

        chunks = _PickleChunks(out)
        pickle.Pickler(chunks, protocol=5, buffer_callback=oob).dump(pickle.PickleBuffer(v) if name == "big" else v)
        out.record(b"S")
    out.record(b"M", b"{}")
    out.record(b"Z")
    out.flush()
    os.close(fd)
    with open(path, "ab") as f:
        f.write(extra)
    return values

def check(values):
    for name, v in values.items():
        got = bytes(memoryview(_ns[name])) if name == "big" else _ns[name]
        assert got == v, "%s loaded wrong" % name

d = tempfile.mkdtemp(dir=os.environ["TEST_TMP"])
try:
    os.close(os.open(os.path.join(d, "probe"), os.O_RDONLY | os.O_CREAT | os.O_DIRECT))
    direct = True
except OSError:
    direct = False  # tmpfs: the whole file goes through the page cache
parallel = [0]
_real_read_parallel = _read_parallel

def _read_parallel(*args):
    parallel[0] += 1
    return _real_read_parallel(*args)

for big, extra in ((3 * _READ_PIECE + 12345, b""), (_BIG, b""), (5 * _READ_PIECE, b"tail")):
    path = os.path.join(d, "s")
    values = write(path, big, extra)
    failed, digest = _restore_stream(os.open(path, os.O_RDONLY))
    with open(path, "rb") as f:
        data = f.read()
    want = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    assert failed == [], failed
    assert digest == want, (big, digest, want)
    check(values)
    # From a pipe: the same values, no digest (the server hashes what it sends).
    r, w = os.pipe()
    if os.fork() == 0:
        os.close(r)
        _write_all(w, data)
        os._exit(0)
    os.close(w)
    failed, digest = _restore_stream(r)
    os.wait()
    assert failed == [] and digest is None, (failed, digest)
    check(values)
# No thread to spare (the sandbox's process limit): fewer reads in flight, or none but this thread's.
import _thread
real_start = _thread.start_new_thread
for allowed in (0, 1):
    started = [0]

    def limited(f, args, allowed=allowed):
        if started[0] >= allowed:
            raise RuntimeError("can't start new thread")
        started[0] += 1
        return real_start(f, args)

    _thread.start_new_thread = limited
    values = write(path, 3 * _READ_PIECE + 4096)
    failed, digest = _restore_stream(os.open(path, os.O_RDONLY))
    with open(path, "rb") as f:
        data = f.read()
    assert failed == [] and digest == {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}, (allowed, digest)
    check(values)
_thread.start_new_thread = real_start
assert parallel[0] >= 5 or not direct, "the large buffers were not read in pieces side by side (%d)" % parallel[0]
# Cut short inside the large buffer: an error, not a short session.
os.truncate(path, 2 * _READ_PIECE)
try:
    _restore_stream(os.open(path, os.O_RDONLY))
except EOFError:
    print("ok")
else:
    print("a stream cut short loaded")
`
	c := exec.Command(py, "-c", script)
	c.Env = append(os.Environ(), "TEST_TMP="+t.TempDir())
	out, err := c.CombinedOutput()
	if err != nil || strings.TrimSpace(string(out)) != "ok" {
		t.Fatalf("%v\n%s", err, out)
	}
}
