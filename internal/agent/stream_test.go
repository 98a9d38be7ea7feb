package agent

import (
	"fmt"
	"hash/crc32"
	"math/rand/v2"
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
	runReplScript(t, `
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

for big, extra, alg in ((3 * _READ_PIECE + 12345, b"", "crc32c"), (_BIG, b"", "crc32c"), (5 * _READ_PIECE, b"tail", "crc32c"),
                        (3 * _READ_PIECE + 12345, b"x", "sha256")):
    path = os.path.join(d, "s")
    values = write(path, big, extra)
    failed, digest = _restore_stream(os.open(path, os.O_RDONLY), alg)
    with open(path, "rb") as f:
        data = f.read()
    want = {"bytes": len(data), alg: crc32c_of(data) if alg == "crc32c" else hashlib.sha256(data).hexdigest()}
    assert failed == [], failed
    assert digest == want, (big, alg, digest, want)
    check(values)
    # From a pipe: the same values, no digest (the server hashes what it sends).
    failed, digest = _restore_stream(pipe_of(data))
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
    assert failed == [] and digest == {"bytes": len(data), "crc32c": crc32c_of(data)}, (allowed, digest)
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
`)
}

// TestRestoreStreamLoadsLargeVariablesAsTheyStream runs repl.py's session stream reader with the host's python3
// on variables whose pickles pass the size up to which a variable is collected whole (_LOAD_WHOLE): each is
// unpickled as it streams, and loads as it was saved: a large bytes, bytearray and str, a list of many strings
// (many frames), one with out-of-band buffers between its frames, a protocol 0 pickle (read by lines) cut into
// records at odd places. A variable that fails part way (a class gone, data after the pickle's end) is listed
// as failed and the next one loads; one the pause dropped (X) is passed over. From a file the digest covers
// every byte; from a pipe too the values load. A 64 MiB bytes object costs its interpreter about its size in
// memory, not three times it.
func TestRestoreStreamLoadsLargeVariablesAsTheyStream(t *testing.T) {
	runReplScript(t, `
import hashlib, pickle, random, tempfile, types
TMP = os.environ["TEST_TMP"]  # the restores set the session's env (none)

try:
    _dill()
except ImportError:  # no dill on this host: its unpickler loads these pickles as the standard one does
    _dill = lambda: types.SimpleNamespace(Unpickler=pickle.Unpickler)
streamed = [0]
_RealPickleIn = _PickleIn

class _PickleIn(_RealPickleIn):
    def __init__(self, *args):
        streamed[0] += 1
        super().__init__(*args)

exec("class Gone:\n    pass", _ns)  # a class of the session's, gone by the time it loads

def pickled(v, out):
    def oob(buf):
        with buf.raw() as m:
            if m.nbytes < 1 << 16:
                return True
            out.direct(b"B", m)
        return False
    chunks = _PickleChunks(out)
    pickle.Pickler(chunks, protocol=5, buffer_callback=oob).dump(v)

def write(path, variables):
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    out = _StreamOut(fd)
    for name, how, v in variables:
        out.record(b"V", name.encode())
        if how == "raw":  # pickle bytes v, cut into records at odd places
            for i in range(0, len(v), 100003):
                out.record(b"P", v[i:i + 100003])
        else:
            pickled(v, out)
        out.record(b"X" if how == "dropped" else b"S")
    out.record(b"M", b"{}")
    out.record(b"Z")
    out.flush()
    os.close(fd)

def pb(n):
    return pickle.PickleBuffer(bytearray(random.randbytes(n)))

rnd = random.Random(7)
strings = ["s%d-%s" % (i, "é" * rnd.randrange(1, 200)) for i in range(100000)]
mixed = [strings[:30000], pb(3 << 20), strings[30000:60000], pb(1 << 16), pb(5 << 20), strings[60000:], pb(3 << 20)]
gone = [strings, _ns["Gone"](), pb(4 << 20), strings[:50000], pb(3 << 20)]
variables = [
    ("small", "", "x" * 100),
    ("blob", "", random.randbytes(40 << 20)),
    ("ba", "", bytearray(random.randbytes(20 << 20))),
    ("text", "", "ü" * (6 << 20) + "ascii" * (1 << 20)),
    ("strings", "", strings),
    ("mixed", "", mixed),
    ("proto0", "raw", pickle.dumps(strings, protocol=0)),
    ("gone", "", gone),
    ("trailing", "raw", pickle.dumps(strings, protocol=5) + b"more pickle data"),
    ("dropped", "dropped", strings),
    ("after", "", [1, 2, 3]),
]
assert len(pickle.dumps(strings, protocol=5)) > _LOAD_WHOLE

def same(a, b):
    if isinstance(a, pickle.PickleBuffer):
        return bytes(a.raw()) == bytes(memoryview(b))
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return type(a) is type(b) and a == b

def check(failed):
    names = sorted(x["name"] for x in failed)
    assert names == ["gone", "trailing"], failed
    for name, how, v in variables:
        if name in ("gone", "trailing", "dropped"):
            assert name not in _ns, name
            continue
        got = _ns.pop(name)
        if how == "raw":
            v = pickle.loads(v)
        assert same(v, got), "%s loaded wrong" % name

d = tempfile.mkdtemp(dir=TMP)
path = os.path.join(d, "s")
write(path, variables)
del _ns["Gone"]
failed, digest = _restore_stream(os.open(path, os.O_RDONLY))
with open(path, "rb") as f:
    data = f.read()
assert digest == {"bytes": len(data), "crc32c": crc32c_of(data)}, digest
check(failed)
assert streamed[0] == 9, streamed[0]  # all but small and after
failed, digest = _restore_stream(pipe_of(data))
os.wait()
assert digest is None
check(failed)
del data
# Memory: a 64 MiB bytes object restored in a fresh child costs about its size (the old reader took three times).
write(path, [("blob", "", random.randbytes(64 << 20))])
os.posix_fadvise(os.open(path, os.O_RDONLY), 0, 0, os.POSIX_FADV_DONTNEED)
rd, wr = os.pipe()
if os.fork() == 0:
    def hwm():
        with open("/proc/self/status") as f:
            return next(int(l.split()[1]) << 10 for l in f if l.startswith("VmHWM"))
    before = hwm()
    failed, _ = _restore_stream(os.open(path, os.O_RDONLY))
    grew = hwm() - before
    os.write(wr, repr((failed, len(_ns["blob"]), grew)).encode())
    os._exit(0)
os.close(wr)
os.wait()
failed, size, grew = eval(os.read(rd, 1000))
assert failed == [] and size == 64 << 20, (failed, size)
assert grew < (64 << 20) * 1.25, "restoring 64 MiB took %d MiB more memory" % (grew >> 20)
print("ok")
`)
}

// TestSessionStreamKeepsLargeStringsInPlace runs repl.py's session stream writer and reader with the host's
// python3 on large strs of every kind CPython has (ASCII, Latin-1, UCS-2 with a lone surrogate, UCS-4, one of
// NULs but for a character in its middle, which looks the same at its ends in every kind), alone, one
// object twice in a list, inside a container whose pickle streams, and in a variable saved again by dill after
// the plain pickler gave up part way: each is written as one U record straight from its memory (the one in
// the list once), and loads equal to what was saved, of the same kind, hashing alike, the shared one as one
// object, from the file and from a pipe. A 64 Mi-character str costs its save next to nothing and its restore
// about its size, where encoding and decoding it took twice.
func TestSessionStreamKeepsLargeStringsInPlace(t *testing.T) {
	runReplScript(t, `
import random, tempfile
TMP = os.environ["TEST_TMP"]
try:
    _dill()
    have_dill = True
except ImportError:
    have_dill = False
rnd = random.Random(5)
base = "".join(rnd.choice("abcdefgh \n") for _ in range(4096)) * 300  # 1.2 M characters
values = {
    "ascii": base,
    "latin": "\xe9" + base,
    "ucs2": base + "\u0100\ud800",  # a lone surrogate too
    "ucs4": "\U0001F600" + base,
    "nuls": "\0" * (1 << 21) + "\u0100" + "\0" * (1 << 21),  # its head and tail alike in every kind
    "shared": [base[1:] + "x"] * 2,
    "container": {"big": "\u0101" + base, "many": [str(i) for i in range(400000)]},
    "small": "short",
}
if have_dill:
    exec("def f():\n    return 41", _ns)
    values["withfunc"] = ("\xe8" + base, _ns["f"])  # the plain pickler writes the str, then stops at f
_ns.update(values)

def records(path):
    with open(path, "rb") as f:
        data = f.read()
    assert data[:len(_MAGIC)] == _MAGIC
    i, kinds = len(_MAGIC), []
    while i < len(data):
        kind, n = _HDR.unpack_from(data, i)
        kinds.append((kind, data[i + _HDR.size:i + _HDR.size + 1] if kind == b"U" else n))
        i += _HDR.size + n
    return data, kinds

d = tempfile.mkdtemp(dir=TMP)
path = os.path.join(d, "s")
skipped, _ = _snapshot_stream(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600))
assert skipped == [], skipped
data, kinds = records(path)
codes = sorted(c[0] for k, c in kinds if k == b"U")
want = [0, 0, 1, 2, 2, 2, 4] + ([1, 1] if have_dill else [])  # withfunc's str twice: its first attempt is dropped
assert codes == sorted(want), codes
for name in values:
    del _ns[name]
_ns.pop("f", None)

def check():
    for name, v in values.items():
        got = _ns.pop(name)
        if name == "withfunc":
            assert got[0] == v[0] and got[1]() == 41, name
            continue
        assert got == v, name

for piped in (False, True):  # from the stored file, and from a pipe as from S3
    failed, _ = _restore_stream(pipe_of(data) if piped else os.open(path, os.O_RDONLY))
    assert failed == [], failed
    got = {name: _ns[name] for name in values}
    for name in ("ascii", "latin", "ucs2", "ucs4", "nuls"):
        s = got[name]
        assert type(s) is str and s == values[name], name
        assert sys.getsizeof(s) == sys.getsizeof(values[name]), name  # the same kind
        assert {s: 1}.get(values[name]) == 1 and hash(s) == hash(values[name]), name
        assert s.isascii() == values[name].isascii(), name
    assert got["shared"][0] is got["shared"][1], "one str saved twice in a list loaded as two"
    assert got["container"]["big"] == values["container"]["big"]
    check()
    if piped:
        os.wait()

def hwm():
    with open("/proc/self/status") as f:
        return next(int(l.split()[1]) << 10 for l in f if l.startswith("VmHWM"))

def in_child(fn):
    rd, wr = os.pipe()
    if os.fork() == 0:
        os.write(wr, repr(fn()).encode())
        os._exit(0)
    os.close(wr)
    os.wait()
    return eval(os.read(rd, 1000))

# Memory: a str of 64 Mi characters, saved and restored each in a fresh child.
_ns["text"] = "\xe9" * (64 << 20)
def save():
    before = hwm()
    _snapshot_stream(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600))
    return hwm() - before
grew = in_child(save)
assert grew < (64 << 20) * 0.25, "saving a 64 MiB str took %d MiB more memory" % (grew >> 20)
del _ns["text"]
def restore():
    before = hwm()
    failed, _ = _restore_stream(os.open(path, os.O_RDONLY))
    grew = hwm() - before
    return failed, _ns["text"] == "\xe9" * (64 << 20), grew
failed, same, grew = in_child(restore)
assert failed == [] and same, failed
assert grew < (64 << 20) * 1.25, "restoring a 64 MiB str took %d MiB more memory" % (grew >> 20)
print("ok")
`)
}

// pipeOf gives a pipe's read end that a forked child fills with data, as the server streams a snapshot from S3;
// the script waits for the child once it has read it.
const pipeOf = `
def pipe_of(data):
    r, w = os.pipe()
    if os.fork() == 0:
        os.close(r)
        _write_all(w, data)
        os._exit(0)
    os.close(w)
    return r
`

// crc32cOf is the CRC-32C of data in one call of the native helper (TestNativeCRC32C checks it against Go's), to
// check that the reader checksums every byte of the file in order.
const crc32cOf = `
def crc32c_of(data):
    h = _CRC32C()
    h.update(bytes(data))
    return h.hexdigest()
`

// runReplScript runs script with the host's python3 after repl.py's definitions (all of it but its last line,
// main()), with TEST_TMP naming a temporary directory of the test's; the script prints "ok" when all held.
func runReplScript(t *testing.T, script string) {
	t.Helper()
	if out := runReplScriptOutput(t, script); strings.TrimSpace(out) != "ok" {
		t.Fatal(out)
	}
}

// runReplScriptOutput runs script after repl.py's definitions (its loop left out), with the native helper as the
// bootstrap hands it over, and returns what it printed.
func runReplScriptOutput(t *testing.T, script string) string {
	t.Helper()
	py, err := exec.LookPath("python3")
	if err != nil {
		t.Skip("no python3")
	}
	loop := strings.TrimSuffix(strings.TrimRight(replSource, "\n"), "main()")
	if loop == replSource {
		t.Fatal("repl.py no longer ends with main()")
	}
	dir := t.TempDir()
	if err := os.WriteFile(dir+"/helper.so", forkChildHelper, 0o600); err != nil {
		t.Fatal(err)
	}
	helper := "_ramify_fork_helper = open(" + `"` + dir + `/helper.so", "rb").read()` + "\n"
	c := exec.Command(py, "-c", helper+loop+crc32cOf+pipeOf+script)
	c.Env = append(os.Environ(), "TEST_TMP="+t.TempDir())
	out, err := c.CombinedOutput()
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	return string(out)
}

// TestNativeCRC32C: the native helper's CRC-32C (repl.py _CRC32C, forkchild.c ramify_crc32c) is Go's
// hash/crc32 Castagnoli, which the snapshot store computes, for every length and alignment around its 8-byte
// steps, from bytes, bytearrays and memoryviews, in one update or many.
func TestNativeCRC32C(t *testing.T) {
	data := make([]byte, 1<<20+77)
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range data {
		data[i] = byte(rng.Uint32())
	}
	tab := crc32.MakeTable(crc32.Castagnoli)
	var want strings.Builder
	type cut struct{ off, n int }
	var cuts []cut
	for off := range 9 {
		for _, n := range []int{0, 1, 7, 8, 9, 15, 16, 17, 63, 4096 + 3, 1 << 20} {
			cuts = append(cuts, cut{off, n})
			fmt.Fprintf(&want, "%08x\n", crc32.Checksum(data[off:off+n], tab))
		}
	}
	fmt.Fprintf(&want, "%08x\n", crc32.Checksum(data, tab))
	dir := t.TempDir()
	if err := os.WriteFile(dir+"/data", data, 0o600); err != nil {
		t.Fatal(err)
	}
	var spec strings.Builder
	for _, c := range cuts {
		fmt.Fprintf(&spec, "(%d, %d), ", c.off, c.n)
	}
	out := runReplScriptOutput(t, `
data = open("`+dir+`/data", "rb").read()
kinds = [bytes, bytearray, lambda b: memoryview(bytearray(b))]
for i, (off, n) in enumerate([`+spec.String()+`]):
    sums = set()
    for kind in kinds:
        h = _CRC32C()
        h.update(kind(data[off:off + n]))
        sums.add(h.hexdigest())
    assert len(sums) == 1, (off, n, sums)
    print(sums.pop())
h = _CRC32C()
for k in range(0, len(data), 1000):
    h.update(memoryview(data)[k:k + 1000])
print(h.hexdigest())
`)
	if out != want.String() {
		t.Fatalf("native CRC-32C:\n%s\nGo's:\n%s", out, want.String())
	}
}
