# ramify's in-sandbox Python interpreter loop (embedded in the ramify binary, run as `python3 -c`).
# It talks JSON lines with the sandbox agent over the socket on fd 3 (or, in a forked child, over a socket it
# connects itself): {"op": "run", "code": ...} -> stream events, then one {"type": "result", ...}.
import array, ast, ctypes, fcntl, gc, io, json, linecache, mmap, os, select, signal, socket, stat, struct, sys, traceback

_sock = None
_rfile = None
# User code runs in a fresh __main__ module, so that pickle/dill see its functions and classes as __main__'s.
import types as _types
import _socket
_main_mod = _types.ModuleType("__main__")
_main_mod.__dict__["__builtins__"] = __builtins__
sys.modules["__main__"] = _main_mod
_ns = _main_mod.__dict__
_count = 0
_emit_sync = True  # false in fork children: their fd 1/2 are still the parent's pipes
_forked = []  # pids of fork children this process made; reaped lazily
_fork_froze = False  # whether the objects frozen out of the garbage collector were frozen by a fork (_fork)


def _send(obj):
    _sock.sendall((json.dumps(obj) + "\n").encode("utf-8", "surrogatepass"))


class _Reader:
    """Reads the agent's JSON lines from a socket, keeping any file descriptors sent along (SCM_RIGHTS)."""

    def __init__(self, sock):
        self.sock, self.buf, self.fds = sock, bytearray(), []

    def readline(self):
        while True:
            i = self.buf.find(b"\n")
            if i >= 0:
                line = bytes(self.buf[:i + 1])
                del self.buf[:i + 1]
                return line
            data, anc, _, _ = self.sock.recvmsg(65536, socket.CMSG_SPACE(253 * 4))
            for level, typ, payload in anc:
                if level == socket.SOL_SOCKET and typ == socket.SCM_RIGHTS:
                    a = array.array("i")
                    a.frombytes(payload[:len(payload) - len(payload) % a.itemsize])
                    self.fds.extend(a)
            if not data:
                line = bytes(self.buf)
                self.buf.clear()
                return line
            self.buf += data

    def take_fd(self):
        if not self.fds:
            raise OSError("the agent sent no stream descriptor")
        return self.fds.pop(0)


# Output goes to the agent in events of at most _CHUNK characters: at most 12 bytes each in JSON (a character
# outside the BMP is two \\uXXXX escapes), so no line exceeds 768 KiB.
_CHUNK = 1 << 16
# A result's value, error value and traceback are each cut to _FIELD_LIMIT bytes of JSON (the agent cuts them
# to the same size in its own encoding): the result line stays far below the agent's line limit.
_FIELD_LIMIT = 4 << 20
_TRUNCATED = "\n[output truncated]\n"


def _json_len(s):
    return len(json.dumps(s)) - 2


def _bounded(s, limit=_FIELD_LIMIT):
    """s, or its longest prefix whose JSON encoding fits in limit bytes followed by the truncation note."""
    if s is None or len(s) * 12 <= limit:
        return s
    used = 0
    for i in range(0, len(s), _CHUNK):
        piece = s[i:i + _CHUNK]
        n = _json_len(piece)
        if used + n > limit:
            lo, hi = 0, len(piece)  # the longest prefix of piece that fits: lo fits, hi does not
            while hi - lo > 1:
                mid = (lo + hi) // 2
                if used + _json_len(piece[:mid]) <= limit:
                    lo = mid
                else:
                    hi = mid
            return s[:i + lo] + _TRUNCATED
        used += n
    return s


class _Stream:
    """A text stream that forwards every write to the agent as events."""

    encoding = "utf-8"
    errors = "replace"

    def __init__(self, name):
        self.name = name

    def write(self, s):
        if not isinstance(s, str):
            raise TypeError("write() argument must be str, not %s" % type(s).__name__)
        # In pieces: one event per piece keeps every line to the agent small, whatever the characters escape to.
        for i in range(0, len(s), _CHUNK):
            _send({"type": self.name, "data": s[i:i + _CHUNK]})
        return len(s)

    def writelines(self, lines):
        for line in lines:
            self.write(line)

    def flush(self):
        pass

    def isatty(self):
        return False

    def writable(self):
        return True

    def readable(self):
        return False

    def fileno(self):
        return 1 if self.name == "stdout" else 2


# Children made ahead of a fork (the server forks an idle sandbox before a fork is asked for) run the
# interpreter's at-fork handlers as any fork does, before anyone asked for the fork. The standard library's only
# reset state, and a library's handlers for its children reset the child's; but handlers that run in the parent
# (before, after_in_parent) outside the standard library, or that session code registered for children, may do
# what someone sees (count forks, send a message): registering one makes _fork_hooks true, and the server then
# makes no children ahead for this interpreter (op fork_check).
_fork_hooks = False
_register_at_fork = os.register_at_fork
_STDLIB = frozenset(sys.stdlib_module_names)


def _watch_register_at_fork(**hooks):
    global _fork_hooks
    g = sys._getframe(1).f_globals
    name = (g.get("__name__") or "").split(".")[0]
    path = g.get("__file__") or ""
    library = "/site-packages/" in path or "/dist-packages/" in path
    if name not in _STDLIB and ("before" in hooks or "after_in_parent" in hooks or
                                ("after_in_child" in hooks and not library)):
        _fork_hooks = True
    return _register_at_fork(**hooks)


_watch_register_at_fork.__name__ = _watch_register_at_fork.__qualname__ = "register_at_fork"
_watch_register_at_fork.__doc__ = _register_at_fork.__doc__
os.register_at_fork = _watch_register_at_fork


def _cell_name(n):
    return "<cell %d>" % n


def _user_traceback(e):
    """The exception formatted as a notebook shows it: from the first frame of a cell on (ramify's own frames,
    and ast's for a SyntaxError in the cell itself, left out), with the cells' source lines (linecache)."""
    tb = e.__traceback__
    while tb is not None and not tb.tb_frame.f_code.co_filename.startswith("<cell "):
        tb = tb.tb_next
    return "".join(traceback.format_exception(type(e), e, tb))


def _set_env(env):
    """Set a run's variables in os.environ; returns what to put back afterwards (None: was unset)."""
    saved = {}
    for k, v in (env or {}).items():
        saved[k] = os.environ.get(k)
        os.environ[k] = v
    return saved


def _restore_env(saved):
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


def _dedent(code):
    """A cell whose first line is indented (code pasted from an indented block, a triple-quoted string in the
    caller's program) loses that indentation on every line that starts with it, as IPython does for a cell."""
    lines = code.splitlines(True)
    first = next((line for line in lines if line.strip()), "")
    indent = first[: len(first) - len(first.lstrip(" \t"))]
    if not indent:
        return code
    return "".join(line[len(indent):] if line.startswith(indent) else line for line in lines)


# Rich results, as a Jupyter kernel gives them: a cell's trailing expression becomes an execute_result and
# display() / plt.show() / figures left open become display_data, each a mime bundle ({mime: value}, binary
# formats base64, text/plain always present). They go to the agent as events, in order, as they happen. All of
# one cell's bundles together are held to _RESULTS_LIMIT bytes of JSON: a bundle that does not fit is replaced
# by a text/plain note saying so (the agent enforces the same limit).
_RESULTS_LIMIT = 16 << 20
_results_used = 0
_REPRS = (("_repr_png_", "image/png"), ("_repr_jpeg_", "image/jpeg"), ("_repr_svg_", "image/svg+xml"),
          ("_repr_html_", "text/html"), ("_repr_markdown_", "text/markdown"), ("_repr_latex_", "text/latex"),
          ("_repr_json_", "application/json"))
_BINARY = ("image/png", "image/jpeg")


def _real_method(obj, name):
    """obj's method name, as IPython finds it: not on classes, not on objects that answer every attribute."""
    import inspect
    if inspect.isclass(obj):
        return None
    try:
        if getattr(obj, "_ipython_canary_method_should_not_exist_", None) is not None:
            return None
        m = getattr(obj, name, None)
    except Exception:
        return None
    return m if callable(m) else None


def _encode(mime, v):
    """A repr's value as it goes into a bundle: binary images base64, JSON as is, the rest text."""
    import base64
    if isinstance(v, tuple) and len(v) == 2:  # (data, metadata), as IPython's formatters accept
        v = v[0]
    if v is None:
        return None
    if mime in _BINARY or isinstance(v, (bytes, bytearray)):
        if isinstance(v, (bytes, bytearray)):
            return base64.b64encode(bytes(v)).decode("ascii")
        return str(v)  # already base64, as IPython's Image gives it
    if mime == "application/json" or mime.endswith("+json"):
        json.dumps(v)  # raises if it is not JSON: that format is left out
        return v
    return str(v)


def _figure_png(fig):
    buf = io.BytesIO()
    fig.savefig(buf, format="png", bbox_inches="tight")
    return buf.getvalue()


def _bundle(obj, include=None, exclude=None):
    """obj's mime bundle: _repr_mimebundle_, then the _repr_*_ methods; matplotlib figures as PNG."""
    data = {}
    mf = sys.modules.get("matplotlib.figure")
    if mf is not None and isinstance(obj, mf.Figure):
        data["image/png"] = _figure_png(obj)
    m = _real_method(obj, "_repr_mimebundle_")
    if m is not None:
        try:
            try:
                got = m(include=include, exclude=exclude)
            except TypeError:
                got = m()
            if isinstance(got, tuple):
                got = got[0]
            data.update(got or {})
        except Exception as e:
            sys.stderr.write("ramify: %s._repr_mimebundle_() failed: %s: %s\n" % (type(obj).__name__, type(e).__name__, e))
    for name, mime in _REPRS:
        if mime in data:
            continue
        m = _real_method(obj, name)
        if m is not None:
            try:
                data[mime] = m()
            except NotImplementedError:
                pass
            except Exception as e:  # a broken repr costs its format, not the cell (IPython prints it too)
                sys.stderr.write("ramify: %s.%s() failed: %s: %s\n" % (type(obj).__name__, name, type(e).__name__, e))
    out = {}
    for mime, v in data.items():
        if include and mime not in include or exclude and mime in exclude:
            continue
        try:
            v = _encode(mime, v)
        except (TypeError, ValueError):
            continue
        if v is not None:
            out[mime] = v
    if "text/plain" not in out:
        out["text/plain"] = repr(obj)
    return out


def _publish(kind, data):
    """Send one result to the agent, within what is left of the cell's results budget."""
    global _results_used
    try:
        size = len(json.dumps(data))
    except (TypeError, ValueError) as e:
        data = {"text/plain": "[result left out: not JSON (%s)]" % e}
        size = len(json.dumps(data))
    if _results_used + size > _RESULTS_LIMIT:
        data = {"text/plain": "[result left out: its %d bytes would take this cell's results past their limit of "
                              "%d MiB]" % (size, _RESULTS_LIMIT >> 20)}
        size = len(json.dumps(data))
        if _results_used + size > _RESULTS_LIMIT:
            return
    _results_used += size
    _send({"type": kind, "bundle": data})


def display(*objs, include=None, exclude=None, metadata=None, transient=None, display_id=None, raw=False,
            clear=False, **kwargs):
    """IPython.display.display for a cell without an IPython kernel: each object becomes a display_data."""
    for obj in objs:
        if raw:  # obj is a bundle already
            data = {k: _encode(k, v) for k, v in dict(obj).items()
                    if not (include and k not in include or exclude and k in exclude)}
            data.setdefault("text/plain", "")
        else:
            data = _bundle(obj, include, exclude)
        _publish("display_data", data)
    if display_id:  # a handle whose update() shows the new object as one more display_data (no output to replace)
        mod = sys.modules.get("IPython.core.display_functions")
        if mod is not None:
            return mod.DisplayHandle(None if display_id is True else display_id)


def _publish_display_data(data, metadata=None, source=None, *, transient=None, **kwargs):
    _publish("display_data", dict(data))


def _show(*args, **kwargs):
    """plt.show() as Jupyter's inline backend does it: every open figure becomes a display_data, then closes."""
    _flush_figures()


def _flush_figures(skip=None):
    plt = sys.modules.get("matplotlib.pyplot")
    if plt is None:
        return
    for num in plt.get_fignums():
        fig = plt.figure(num)
        if fig is not skip:
            _publish("display_data", {"image/png": _encode("image/png", _figure_png(fig)), "text/plain": repr(fig)})
    plt.close("all")


# Hooks installed when user code imports these modules: display() and plt.show() publish results.
def _clear_output(wait=False):
    pass


def _update_display(obj, *, display_id, **kwargs):
    display(obj, **{k: v for k, v in kwargs.items() if k in ("include", "exclude", "raw")})


_PATCHES = {
    "IPython.core.display_functions": {"display": display, "publish_display_data": _publish_display_data,
                                       "clear_output": _clear_output, "update_display": _update_display},
    "matplotlib.pyplot": {"show": _show},
}
# Named after the attribute they replace, so that a variable holding one (from IPython.display import display)
# pickles by reference (a pause, a fork's snapshot) and finds the replacement again when it is loaded.
for _mod, _fns in _PATCHES.items():
    for _attr, _fn in _fns.items():
        _fn.__module__, _fn.__name__, _fn.__qualname__ = _mod, _attr, _attr


class _Patcher:
    """A meta path finder that patches _PATCHES' modules right after they load."""

    def find_spec(self, name, path=None, target=None):
        if name not in _PATCHES:
            return None
        import importlib.machinery
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return None
        exec_module = spec.loader.exec_module

        def patched(module):
            exec_module(module)
            for attr, fn in _PATCHES[name].items():
                setattr(module, attr, fn)

        spec.loader.exec_module = patched
        return spec


sys.meta_path.insert(0, _Patcher())
os.environ.setdefault("MPLBACKEND", "Agg")
import builtins as _builtins
_builtins.display = display  # as in a Jupyter kernel, display() needs no import


def _run(code, env=None):
    global _count, _results_used
    _count += 1
    _results_used = 0
    code = _dedent(code)
    value = None
    error = None
    shown = None
    out, err = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = _Stream("stdout"), _Stream("stderr")
    saved_env = _set_env(env)
    # Each cell's source under its own name, so that tracebacks (and inspect) show its lines, also when a function
    # it defined fails in a later cell. mtime None: linecache.checkcache never drops it.
    name = _cell_name(_count)
    linecache.cache[name] = (len(code), None, code.splitlines(True), name)
    try:
        # SIGINT (the agent's timeout interrupt) is only let through while user code runs.
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
        v = _eval_cell(code, name, _ns)
        if v is not None:
            _ns["_"] = v
            value = _bounded(repr(v))
            shown = v
            _publish("execute_result", _bundle(v))
    except BaseException as e:  # SystemExit and KeyboardInterrupt included: the interpreter stays alive
        error = {
            "name": type(e).__name__[:1000],
            "value": _bounded(str(e)),
            "traceback": _bounded(_user_traceback(e)),
        }
    finally:
        _block_sigint()
        # Figures the cell left open are shown, as the inline backend does after a cell (not the one the cell
        # returned: it is the execute_result already).
        try:
            _flush_figures(skip=shown)
        except Exception as e:
            sys.stderr.write("ramify: showing the cell's open figures failed: %s: %s\n" % (type(e).__name__, e))
        _restore_env(saved_env)
        try:
            sys.stdout.flush()
        except Exception:
            pass
        sys.stdout, sys.stderr = out, err
        _end_output(_count)
    return {"type": "result", "value": value, "error": error, "execution_count": _count}


def _eval_cell(code, name, ns):
    """Run code as a cell named name in namespace ns: its statements, then its last expression, whose value it
    returns (None for a cell that does not end in one)."""
    tree = ast.parse(code, name, "exec")
    last = None
    if tree.body and isinstance(tree.body[-1], ast.Expr):
        last = ast.Expression(tree.body.pop().value)
    exec(compile(tree, name, "exec"), ns)
    return None if last is None else eval(compile(last, name, "eval"), ns)


def _block_sigint():
    """Block SIGINT again once a cell's code is done, dropping one that landed just after it."""
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    while signal.sigtimedwait({signal.SIGINT}, 0) is not None:
        pass


def _discard_sigint():
    """Drop a SIGINT pending (blocked) in this process: one that the agent sent to interrupt the last run after
    that run's code had ended and _block_sigint had run. The agent asks for it after a run it interrupted, before
    the next run may start (discardSigint in repl.go), so that the next cell does not get it as soon as it lets
    SIGINT through. Returns how many were dropped (0 or 1: a signal's instances do not queue)."""
    n = 0
    while signal.sigtimedwait({signal.SIGINT}, 0) is not None:
        n += 1
    return n


def _end_output(n):
    """Mark the end of run n's fd-level output (subprocesses, C code) on both pipes, so that the agent can tell
    it has read all of it before it answers."""
    if not _emit_sync:
        return
    marker = ("\x00ramify-sync:%d\x00" % n).encode()
    for fd in (1, 2):
        try:
            os.write(fd, marker)
        except OSError:
            pass


def _warm():
    """Run a cell through what _run does, leaving no trace in the session (no count, no cell, no value, no
    figures): a fork child made ahead of its fork takes the copy-on-write faults of a first run while it waits,
    not on its first call. The agent sends it as a run ({"op": "run", "warm": true}), whose path it takes too;
    it drops the cell's result event."""
    global _results_used
    used = _results_used
    out, err = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = _Stream("stdout"), _Stream("stderr")
    saved_env = _set_env(None)
    try:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
        v = _eval_cell("1", "<ramify-warm>", {})
        _bounded(repr(v))
        _publish("execute_result", _bundle(v))
    finally:
        _block_sigint()
        _restore_env(saved_env)
        sys.stdout, sys.stderr = out, err
        _results_used = used
        # The last run's count again: the agent's wait for this one's output is over at once, and the next run's
        # markers are the first with its count.
        _end_output(_count)
    return {"type": "result", "value": None, "error": None, "execution_count": _count}


def _reap():
    for pid in list(_forked):
        try:
            done, status = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            done, status = pid, 0
        if done:
            _forked.remove(pid)
            if os.WIFSIGNALED(status) and os.WTERMSIG(status) != signal.SIGKILL or os.WIFEXITED(status) and os.WEXITSTATUS(status) not in (0,):
                _log_failure("fork child %d ended with status %#x" % (pid, status))


_libc = None
_BPF = bytes.fromhex(os.environ.pop("RAMIFY_SECCOMP_BPF", ""))
_BPF_FLAGS = int(os.environ.pop("RAMIFY_SECCOMP_FLAGS", "0"))


def _install_filter():
    """Install ramify's seccomp filter on this process; return the listener fd (the agent supervises it)."""
    global _libc
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)

    class _Prog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]

    buf = ctypes.create_string_buffer(_BPF, len(_BPF))
    prog = _Prog(len(_BPF) // 8, ctypes.cast(buf, ctypes.c_void_p))
    # seccomp(SECCOMP_SET_MODE_FILTER, flags, &prog); 317 on x86_64
    fd = _libc.syscall(317, 1, _BPF_FLAGS, ctypes.byref(prog))
    if fd < 0:
        e = ctypes.get_errno()
        raise OSError(e, "seccomp: %s" % os.strerror(e))
    return fd


def _send_fd(obj, fd):
    socket.send_fds(_sock, [(json.dumps(obj) + "\n").encode()], [fd])
    os.close(fd)


_CAPS = os.environ.pop("RAMIFY_CAPS", "")
# The allocator settings ramify started this interpreter with (see heapEnv in repl.go) are not the sandbox's
# environment: os.environ, and the processes this interpreter starts, get the sandbox's own values (or none).
for _k, _v in json.loads(os.environ.pop("RAMIFY_HEAP_ENV", "{}")).items():
    if _v is None:
        os.environ.pop(_k, None)
    else:
        os.environ[_k] = _v


def _confine():
    """Reduce this process to sandbox code's capabilities (the agent's RAMIFY_CAPS, "<bounding>:<permitted>" in
    hex): every capability outside the bounding mask leaves the bounding set, so no program this interpreter
    starts ever holds it; the permitted and effective sets keep the second mask (CAP_SYS_ADMIN in addition, for
    a fork child's setns); no inheritable or ambient capabilities; no_new_privs; not dumpable."""
    global _libc
    if not _CAPS:
        return
    if _libc is None:
        _libc = ctypes.CDLL(None, use_errno=True)
    bounding, permitted = (int(x, 16) for x in _CAPS.split(":"))
    with open("/proc/sys/kernel/cap_last_cap") as f:
        last = int(f.read())

    def check(ok, what):
        if not ok:
            e = ctypes.get_errno()
            raise OSError(e, "%s: %s" % (what, os.strerror(e)))

    for cap in range(last + 1):
        if not bounding >> cap & 1:
            check(_libc.prctl(24, cap, 0, 0, 0) == 0 or ctypes.get_errno() == 22, "drop capability %d" % cap)  # PR_CAPBSET_DROP
    hdr = (ctypes.c_uint32 * 2)(0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this process
    data = (ctypes.c_uint32 * 6)(permitted & 0xFFFFFFFF, permitted & 0xFFFFFFFF, 0,
                                 permitted >> 32, permitted >> 32, 0)  # effective, permitted, inheritable x 2
    check(_libc.capset(hdr, data) == 0, "capset")
    check(_libc.prctl(47, 4, 0, 0, 0) == 0, "clear ambient capabilities")  # PR_CAP_AMBIENT, CLEAR_ALL
    check(_libc.prctl(38, 1, 0, 0, 0) == 0, "no_new_privs")  # PR_SET_NO_NEW_PRIVS
    # Not dumpable: the interpreter holds what the sandbox has loaded (data, models, credentials in variables);
    # without CAP_SYS_PTRACE, which no sandbox process has, nothing can open its /proc/<pid>/mem, environ, fd or
    # root: not a fork sibling's processes, which share its uid in the family's user namespace. Fork children
    # inherit it; the interpreter never execs, so it never reverts.
    check(_libc.prctl(4, 0, 0, 0, 0) == 0, "not dumpable")  # PR_SET_DUMPABLE


# A fork child must share nothing with its parent and siblings but what it was forked from: its descriptors
# and shared memory mappings would otherwise still be the parent's objects (a directory of the parent's file
# system to write through, the parent's sockets outside the child's network and egress policy, a MAP_SHARED
# region both write). The parent lists its descriptors as it forks (_fds_of); each child makes them, and its
# shared mappings, its own before it runs anything (internal/agent/forkchild/forkchild.c, _ForkHelper).

_O_PATH = getattr(os, "O_PATH", 0o10000000)
_REOPEN_FLAGS = os.O_ACCMODE | os.O_APPEND | os.O_NONBLOCK | os.O_CLOEXEC | _O_PATH | getattr(os, "O_DIRECT", 0)
# The fork child's set-up, compiled (forkchild_amd64.so), as the bootstrap found it in its payload (repl.go).
_fork_helper_so = globals().pop("_ramify_fork_helper", None)
_fork_helper = None  # a _ForkHelper, made at the first fork


def _fd_kind(fd):
    """How a fork child rebuilds descriptor fd, as (how, path, flags, offset): "open" for a regular file,
    directory or character device it opens again by path in its own file system; "copy" for a regular file no
    path reaches (deleted, a memfd), copied into a memfd of its own; "null" for the rest (sockets, pipes, FIFOs,
    event, epoll and pid fds), which are the parent's: /dev/null takes their place. None: fd is not open."""
    try:
        path = os.readlink("/proc/self/fd/%d" % fd)
        st = os.fstat(fd)
        with open("/proc/self/fdinfo/%d" % fd) as f:
            info = dict(line.split(":", 1) for line in f if ":" in line)
        flags = int(info["flags"].strip(), 8)
        pos = int(info.get("pos", "0").strip())
    except (OSError, KeyError, ValueError):
        try:
            fcntl.fcntl(fd, fcntl.F_GETFD)
        except OSError:
            return None
        return ("null", None, os.O_CLOEXEC, 0)
    # The flags a descriptor was opened with (an O_TMPFILE file's carry O_DIRECTORY), as it is opened again.
    flags &= _REOPEN_FLAGS
    reachable = path.startswith("/") and not path.endswith(" (deleted)")
    if reachable and stat.S_ISDIR(st.st_mode):
        return ("open", path, flags | os.O_DIRECTORY, pos)
    if reachable and (stat.S_ISREG(st.st_mode) or stat.S_ISCHR(st.st_mode)):
        return ("open", path, flags, pos)
    if stat.S_ISREG(st.st_mode):
        return ("copy", None, flags, pos)
    return ("null", None, flags, 0)


def _fds_of(skip):
    """This process's descriptors but 1, 2 (the child's agent gives it pipes of its own) and those in skip, by fd:
    _fd_kind's answers. Stdin is among them: the agent that started the interpreter opened it (/dev/null of that
    agent's file system), and a child kept it as it was, a mount of its parent's (or its zygote's) file system
    that outlives it."""
    fds = {}
    for name in os.listdir("/proc/self/fd"):
        fd = int(name)
        if fd not in (1, 2) and fd not in skip:
            k = _fd_kind(fd)
            if k is not None:
                fds[fd] = k
    return fds


_HOW = {"null": 0, "open": 1, "copy": 2}  # forkchild.c's FD_NULL, FD_OPEN, FD_COPY
_BLOB = struct.Struct("<IiI5iI")  # magic "RFK1", the agent socket, the group, 4 namespaces and "moved", nkeep
_FILE = struct.Struct("<iIiqI")  # fd, how, flags, offset, length of the path
_ANSWER = struct.Struct("<iiiI")  # the child's agent socket, fd 1 and 2 piped, errno, length of what follows


_native_lib = None


def _native():
    """ramify's native helpers (internal/agent/forkchild/forkchild.c: the fork child's set-up, CRC-32C), loaded at
    their first use from the bytes the agent sent with the loop. Fork children of this process inherit the
    mapping."""
    global _fork_helper_so, _native_lib
    if _native_lib is None:
        if not _fork_helper_so:
            raise OSError("this build of ramify has no native helper for this architecture "
                          "(internal/agent/forkchild is built for x86-64)")
        fd = os.memfd_create("ramify-fork-child", os.MFD_CLOEXEC)
        try:
            mv = memoryview(_fork_helper_so)
            while mv:
                mv = mv[os.write(fd, mv):]
            lib = ctypes.CDLL("/proc/self/fd/%d" % fd)
        finally:
            os.close(fd)
        lib.ramify_crc32c.argtypes = (ctypes.c_uint32, ctypes.c_void_p, ctypes.c_size_t)
        lib.ramify_crc32c.restype = ctypes.c_uint32
        _native_lib, _fork_helper_so = lib, None
    return _native_lib


class _CRC32C:
    """CRC-32C (Castagnoli) in hashlib's form (update, hexdigest), as a snapshot's parts carry it (snapstore.Sum):
    the native helper's ramify_crc32c (SSE4.2: ~9 GB/s on the machines we measured, against SHA-256's ~1.7), which
    releases the GIL as it runs, like hashlib."""

    def __init__(self):
        self._f = _native().ramify_crc32c
        self.crc = 0

    def update(self, data):
        n = data.nbytes if isinstance(data, memoryview) else len(data)
        if not n:
            return
        if not isinstance(data, bytes):
            try:
                data = (ctypes.c_char * n).from_buffer(data)
            except TypeError:  # a read-only buffer
                data = bytes(data)
        self.crc = self._f(self.crc, data, n)

    def hexdigest(self):
        return "%08x" % self.crc


class _ForkHelper:
    """The fork child's set-up in one foreign call, ramify_fork_child (internal/agent/forkchild/forkchild.c):
    each child calls it before it runs any Python code of its own. Done in Python, the same steps (close what
    the child does not keep, wait for the move, take the group, join the namespaces, make descriptors and shared
    mappings its own, connect and attach) wrote to ~180 pages of the parent's heap that each child then copied
    (~0.7 MiB of its own memory, ~215 page faults; the helper: ~0.1 MiB, ~35). Loaded at the first fork from
    the bytes the agent sent with the loop; the parent packs each child's part (blob) before it forks."""

    def __init__(self):
        self.call = _native().ramify_fork_child
        self.call.argtypes = (ctypes.c_char_p, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_size_t)
        self.call.restype = ctypes.c_int
        # The answer's buffer, read in the child as a bytearray (no ctypes but the call itself).
        self.out = bytearray(_ANSWER.size + (1 << 16))
        self.out_c = (ctypes.c_char * len(self.out)).from_buffer(self.out)
        # The image's files report the st_dev of the image's file system (not the overlay's: overlayfs shows a
        # non-directory's own st_dev when its layers are on different file systems, as a btrfs layer over the
        # image directory is). Where the overlay shows its own for them too (all layers on one file system, or
        # xino), an image file cannot be told from the sandbox's own: none is skipped.
        exe = os.stat(os.path.realpath(sys.executable)).st_dev
        self.image_dev = exe if exe != os.stat("/").st_dev else None

    def blob(self, t, own, files, sock):
        """What the child for target t needs (forkchild.c reads it in this order): own, its 4 namespace
        descriptors and its "moved" pipe; files, the parent's descriptors (_fds_of); sock, the parent's agent
        socket, kept until the child has its own."""
        keep = sorted(set(files) | set(own) | {0, 1, 2, sock})
        cwd = os.fsencode(t.get("cwd") or "")
        prefix = ('{"op": "attach_repl", "token": %s, "pid": ' % json.dumps(t["token"])).encode()
        parts = [_BLOB.pack(0x314B4652, sock, t["gid"], *own, len(keep)), struct.pack("<%di" % len(keep), *keep),
                 struct.pack("<I", len(cwd)), cwd,
                 struct.pack("<IQ", self.image_dev is not None, self.image_dev or 0),
                 struct.pack("<I", len(prefix)), prefix, struct.pack("<I", len(files))]
        for fd, (how, path, flags, pos) in files.items():
            p = os.fsencode(path) if path else b""
            parts += [_FILE.pack(fd, _HOW[how], flags, pos, len(p)), p]
        return b"".join(parts)


def _fork(req):
    """Fork this interpreter once per target; each child moves into its target sandbox's namespaces, which come
    as descriptors with the request (5 per target, from index t["ns"]: 4 namespaces and the "moved" pipe). With
    "handover" (a zygote's, for the one sandbox it serves), this interpreter moves itself: _hand_over."""
    nsfds, _rfile.fds = _rfile.fds, []
    if req.get("handover"):
        _hand_over(req["targets"], nsfds)  # returns only if it could not begin
    # Every object that exists now is left out of the cyclic garbage collector while this process forks, and
    # in each child for good: a collection writes to the header of every object it looks at, so a child's
    # first full collection (gc.collect() in user code or a library, or the one the interpreter runs once a
    # quarter more objects have survived) would copy the parent's whole heap, page by page (~250 MB and ~0.7 s
    # for 250 MB of dicts and lists). A child's own objects are collected as usual; a cycle it inherited that
    # it drops stays until it forks itself. The parent takes its objects back at once, unless the session had
    # frozen some itself (gc.freeze), which it keeps.
    global _fork_froze, _fork_helper
    ours = _fork_froze or gc.get_freeze_count() == 0
    gc.freeze()
    try:
        sock = _sock.fileno()
        files = _fds_of(set(nsfds) | {sock})
        if _fork_helper is None:
            _fork_helper = _ForkHelper()
        blobs = [_fork_helper.blob(t, nsfds[t["ns"]:t["ns"] + 5], files, sock) for t in req["targets"]]
        pids = []
        for t, blob in zip(req["targets"], blobs):
            sys.stdout.flush()
            pid = os.fork()
            if pid == 0:
                _fork_froze = True
                try:
                    _become_child(t, blob)
                except BaseException:
                    _log_failure("fork child for agent %s failed:\n%s" % (t.get("agent_pid"), traceback.format_exc()))
                os._exit(70)
            _forked.append(pid)
            pids.append(pid)
        return {"type": "result", "pids": pids}
    finally:
        if ours:  # a child never comes here: it ends in os._exit
            gc.unfreeze()
            _fork_froze = False
        for fd in nsfds:
            os.close(fd)


def _hand_over(targets, nsfds):
    """Become the one target's interpreter in place: what a fork child does, without the fork. A zygote serves one
    sandbox and ran nobody's code, so a copy of it kept nothing from it that it does not keep itself: its fork
    (~20-30 ms for a ~40 MB zygote on a VM here) and the copy's first writes to every page it shared are saved.
    The answer (this pid) goes to the zygote's agent first, which then forgets this interpreter without ending
    it; the server moves it into the sandbox's cgroups. Raises, with nothing changed, if it cannot begin."""
    global _fork_helper
    try:
        if len(targets) != 1:
            raise ValueError("a handover has one target, not %d" % len(targets))
        t = targets[0]
        sock = _sock.fileno()
        files = _fds_of(set(nsfds) | {sock})
        if _fork_helper is None:
            _fork_helper = _ForkHelper()
        blob = _fork_helper.blob(t, nsfds[t["ns"]:t["ns"] + 5], files, sock)
    except BaseException:
        for fd in nsfds:
            os.close(fd)
        raise
    _send({"type": "result", "pids": [os.getpid()]})
    sys.stdout.flush()
    try:
        _become_child(t, blob)
    except BaseException:
        _log_failure("handover to agent %s failed:\n%s" % (t.get("agent_pid"), traceback.format_exc()))
    os._exit(70)


def _log_failure(msg):
    """Report a fork child's failure on its stderr (the parent interpreter's, read by the parent's agent)."""
    try:
        os.write(2, ("ramify repl[%d]: %s\n" % (os.getpid(), msg)).encode(errors="replace"))
    except OSError:
        pass


def _become_child(t, blob):
    """In a fork child, or a zygote handing itself over: become target t's interpreter (forkchild.c does it all,
    blob says how), then serve it."""
    global _sock, _rfile, _emit_sync
    _emit_sync = False
    _sock.detach()  # the helper closes it once it has connected this child's own
    h = _fork_helper
    rc = h.call(blob, len(blob), h.out_c, len(h.out))
    sock, piped, err, n = _ANSWER.unpack_from(h.out)
    data = bytes(h.out[_ANSWER.size:_ANSWER.size + n])
    if rc:
        if rc == 72 and data == b"moved":
            # The server writes one byte to the "moved" pipe once this process is in the child's cgroups; end
            # of file instead: the fork failed.
            _log_failure("not moved into cgroup %s: the fork was abandoned" % t.get("cgroup"))
        elif rc == 72:
            _log_failure("told it was moved, but the supervisor refused the group of the sandbox in cgroup %s" % t.get("cgroup"))
        elif rc == 71:
            _log_failure("agent refused the attach: %r" % data)
        else:
            _log_failure("fork child for agent %s failed: %s: %s" % (t.get("agent_pid"), data.decode(errors="replace"), os.strerror(err)))
        os._exit(rc)
    s = _socket.socket(fileno=sock)  # the C type: what the loop uses of a socket, without socket.py's class
    _sock = s
    _rfile = _Reader(s)
    _rfile.buf += data[data.index(b"\n") + 1:]  # what the agent sent after its answer, if anything
    del _forked[:]
    # fd-level output (subprocesses, C code) goes to this sandbox's agent now, and each run ends with sync markers
    # again. This process stays under the parent interpreter's seccomp filter (a process can have only one filter
    # with a listener); the child's agent adopts a copy of that filter's listener from the parent's agent.
    _emit_sync = bool(piped)
    _serve()
    os._exit(0)


_SKIP_NAMES = {"__builtins__", "__name__", "__loader__", "__spec__", "__package__"}


# A session stream (what a pause stores as session.bin) is b"RMFYSES1" and then records of one kind byte, a
# big-endian u64 length and the payload:
#   V name        a variable begins      P bytes   a chunk of its pickle    B bytes   an out-of-band buffer
#   E             the variable is complete: load it with dill's unpickler
#   S             the variable is complete: its pickle names neither dill nor the session's main module, so the
#                 standard unpickler loads it as dill's would, without importing dill (~30 ms of a resume)
#   X json        drop what came since V: it could not be saved, or ({"retry": true}) it is saved again, from V
#   M json        cwd, env, execution count          Z         the end               _ bytes   padding
#   U code chars  a large str's characters as CPython holds them (code 0: ASCII, 1: Latin-1, 2: UCS-2, 4: UCS-4),
#                 what the variable's pickle's k-th persistent id (k from 0) stands for: see _BigStrs
# Large numpy arrays (also inside data frames) travel as out-of-band buffers: written straight from the array's
# memory and read straight into the restored array's, never copied into a pickle; large strs likewise (U).
# Padding puts every large buffer at a 4 KiB-aligned offset, so that a reader given the stored file can read it
# with direct I/O.
# The loader unpickles a variable whose pickle passes _LOAD_WHOLE as it streams, without ever holding that pickle
# whole (the pickler writes each B record before the P chunk whose NEXT_BUFFER opcode takes it); see _PickleIn.
_MAGIC = b"RMFYSES1"
_HDR = struct.Struct(">cQ")
_ALIGN = 4096
_BIG = 1 << 21  # buffers from this size on are aligned, and read into fresh memory of their own


def _write_all(fd, data):
    mv = memoryview(data).cast("B")
    while mv:
        mv = mv[os.write(fd, mv):]


class _StreamOut:
    """The write side of a session stream: small records are batched, buffers are written in place."""

    def __init__(self, fd):
        self.fd, self.pending, self.off = fd, bytearray(_MAGIC), len(_MAGIC)

    def record(self, kind, payload=b""):
        self.pending += _HDR.pack(kind, len(payload))
        self.pending += payload
        self.off += _HDR.size + len(payload)
        if len(self.pending) >= 1 << 20:
            self.flush()

    def direct(self, kind, mv, prefix=b""):
        if mv.nbytes >= _BIG:
            pad = -(self.off + 2 * _HDR.size + len(prefix)) % _ALIGN
            self.record(b"_", bytes(pad))
        self.pending += _HDR.pack(kind, len(prefix) + mv.nbytes)
        self.pending += prefix
        self.off += _HDR.size + len(prefix) + mv.nbytes
        self.flush()
        _write_all(self.fd, mv)

    def flush(self):
        if self.pending:
            _write_all(self.fd, self.pending)
            self.pending = bytearray()


class _StreamIn:
    """The read side of a session stream, from a pipe or (faster) from the stored file itself. A stored file is
    checksummed as it is read, every byte in order (digest()), with alg, the checksum the snapshot's manifest
    names ("crc32c"; "sha256" for snapshots of earlier versions): the server checks it against the manifest
    instead of reading the file a second time beside this read (1 GiB: ~2 s for the two reads side by side on the
    machines we measured)."""

    def __init__(self, fd, alg="crc32c"):
        self.fd, self.file = fd, stat.S_ISREG(os.fstat(fd).st_mode)
        self.off = 0  # stream offset of the next byte to hand out
        self.ahead = bytearray()  # bytes read ahead of self.off
        self.sum, self.alg = None, alg
        if self.file and alg == "sha256":
            import hashlib
            self.sum = hashlib.sha256()
        elif self.file:
            if alg != "crc32c":
                raise ValueError("session stream: unknown checksum %r" % alg)
            self.sum = _CRC32C()
        self.hashed = 0  # bytes hashed: the file's [0, hashed), all read (into self.ahead or handed out)

    def _pread(self, buf, pos):
        """Read file bytes at pos into buf (a memoryview) and hash them; pos is where the hash has got to."""
        k = os.preadv(self.fd, [buf], pos)
        self.sum.update(buf[:k])
        self.hashed += k
        return k

    def _next(self, n):
        """Read and hash up to n bytes of the file from where the hash has got to."""
        data = os.pread(self.fd, n, self.hashed)
        self.sum.update(data)
        self.hashed += len(data)
        return data

    def _more(self, want):
        want = max(want, 1 << 16)
        if self.file:
            data = self._next(want)  # at self.off + len(self.ahead): everything before it is hashed
        else:
            data = os.read(self.fd, want)
        if not data:
            raise EOFError("session stream ends early")
        self.ahead += data

    def read(self, n):
        """The next n bytes: bytes, or for n from 1 MiB on a bytearray read into straight (see readinto)."""
        if n >= 1 << 20 and len(self.ahead) < n:
            out = bytearray(n)
            self.readinto(memoryview(out))
            return out
        while len(self.ahead) < n:
            self._more(n - len(self.ahead))
        with memoryview(self.ahead) as m:
            out = m[:n].tobytes()  # one copy (bytes(self.ahead[:n]) made two)
        del self.ahead[:n]
        self.off += n
        return out

    def header(self):
        """The next record's kind and payload length."""
        return _HDR.unpack(self.read(_HDR.size))

    def readinto(self, mv):
        """Fill mv (a writable byte memoryview) with the next len(mv) bytes: what was read ahead, then the rest
        straight from the pipe, or from the file through the page cache (mv need not be aligned for direct I/O:
        it is the restored object's own memory), a large rest in pieces side by side, hashed in order."""
        n = len(mv)
        got = min(len(self.ahead), n)
        if got:
            with memoryview(self.ahead) as a:
                mv[:got] = a[:got]
            del self.ahead[:got]
        if self.file and n - got >= _BIG:
            got = _read_parallel(self.fd, mv, got, n, self.off, self.sum)  # the file's [off, off+got) is hashed
            self.hashed = self.off + got
        self._fill(mv, got, n)
        return n

    def _fill(self, mv, got, n):
        """Read the rest of the next n bytes, mv[got:n], straight from the pipe or the file (hashed in order), and
        move past the n."""
        while got < n:
            if self.file:
                k = self._pread(mv[got:], self.off + got)
            else:
                k = os.readv(self.fd, [mv[got:]])
            if not k:
                raise EOFError("session stream ends early")
            got += k
        self.off += n

    def skip(self, n):
        """Pass n bytes: read, not jumped over (a file's skipped bytes, padding or a failed variable's, are hashed
        too), through one small buffer."""
        if n <= len(self.ahead):
            del self.ahead[:n]
            self.off += n
            return
        buf = memoryview(bytearray(min(n, 1 << 20)))
        while n:
            k = min(n, len(buf))
            self.readinto(buf[:k])
            n -= k

    def digest(self):
        """For a stored file: {"bytes": its size, alg: hex checksum} once the rest of it (nothing, for a whole
        stream) is read and checksummed; None for a pipe."""
        if not self.file:
            return None
        while self._next(1 << 20):
            pass
        return {"bytes": self.hashed, self.alg: self.sum.hexdigest()}

    def string(self, n):
        """Read a U record's payload of n bytes: the str it holds, its characters read straight into it."""
        code = self.read(1)[0]
        kind = code or 1
        if kind not in (1, 2, 4) or (n - 1) % kind:
            raise ValueError("session stream: a string record of code %d and %d bytes" % (code, n - 1))
        s, chars = _new_str((n - 1) // kind, code)
        self.readinto(chars)
        return s

    def buffer(self, n):
        """Read n bytes into a buffer of their own (a large one: fresh huge-page memory)."""
        if n < _BIG:
            return bytearray(self.read(n))
        # Huge pages where the kernel gives them (as numpy asks for its own large arrays). Private memory, like
        # the heap numpy allocates: a fork copies it on write (mmap's default, MAP_SHARED, would be shared memory
        # that forked children write through, and slow to copy out of on this kernel). Populated up front when
        # read from a pipe, or without huge pages: faulting small pages in one by one during the read costs three
        # times as much on a VM; a file read with direct I/O into huge pages faults them in as it goes, one per
        # 2 MiB, and is faster so (1 GiB: 0.45-0.5 s against 0.5-1.6 s populated first, on the machines we
        # measured).
        buf = mmap.mmap(-1, n, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        try:
            buf.madvise(mmap.MADV_HUGEPAGE)
        except (AttributeError, OSError):
            pass
        if not (self.file and _huge_pages()):
            try:
                buf.madvise(23)  # MADV_POPULATE_WRITE (Linux 5.14)
            except OSError:
                pass
        mv = memoryview(buf)
        got = min(len(self.ahead), n)
        mv[:got] = self.ahead[:got]
        del self.ahead[:got]
        if self.file:
            got = self._direct(mv, got, n)
        self._fill(mv, got, n)
        mv.release()
        return buf

    def _direct(self, mv, got, n):
        """Read what it can of mv[got:n] with O_DIRECT (file and memory offsets must both be 4 KiB-aligned),
        hashing it in order; return how far it got."""
        start = got + (-(self.off + got) % _ALIGN)  # memory offset of the first aligned file offset
        if self.off % _ALIGN or start >= n:
            return got
        end = start + (n - start) // _ALIGN * _ALIGN
        while got < start:
            k = self._pread(mv[got:start], self.off + got)
            if not k:
                raise EOFError("session stream ends early")
            got += k
        flags = fcntl.fcntl(self.fd, fcntl.F_GETFL)
        try:
            fcntl.fcntl(self.fd, fcntl.F_SETFL, flags | os.O_DIRECT)
        except OSError:
            return got
        try:
            got = _read_parallel(self.fd, mv, got, end, self.off, self.sum)
        finally:
            fcntl.fcntl(self.fd, fcntl.F_SETFL, flags)
        self.hashed = self.off + got
        return got  # the rest, if a read failed, goes through the page cache


_READ_PIECE = 8 << 20  # one direct read
_READS_IN_FLIGHT = 4  # several requests at once read faster than one (1 GiB: ~0.5 s against 0.6-1.6 s here)


def _read_parallel(fd, mv, lo, hi, base, h):
    """Read file bytes [base+lo, base+hi) into mv[lo:hi], _READ_PIECE at a time, with up to _READS_IN_FLIGHT
    reads in flight on threads of their own, and hash them in order on this one, as they come (the reads and
    the hash release the GIL). It returns how far it read and hashed: hi, or the start of a piece whose read
    failed (the caller reads from there another way). EOFError if the file ends early."""
    import _thread
    starts = list(range(lo, hi, _READ_PIECE))
    done = [_thread.allocate_lock() for _ in starts]  # released once the piece is read
    result = [None] * len(starts)  # True, or the exception its read raised
    for d in done:
        d.acquire()
    taken, lock, stop = [0], _thread.allocate_lock(), []

    def work(exited):
        try:
            while not stop:
                with lock:
                    i = taken[0]
                    if i == len(starts):
                        return
                    taken[0] += 1
                o = starts[i]
                e = min(hi, o + _READ_PIECE)
                try:
                    if os.preadv(fd, [mv[o:e]], base + o) != e - o:  # a direct read is short only at the end
                        raise EOFError("session stream ends early")
                    result[i] = True
                except BaseException as ex:
                    result[i] = ex
                    stop.append(1)
                finally:
                    done[i].release()
        finally:
            exited.release()

    threads = []
    for _ in range(min(_READS_IN_FLIGHT, len(starts))):
        exited = _thread.allocate_lock()
        exited.acquire()
        try:
            _thread.start_new_thread(work, (exited,))
        except RuntimeError:
            break  # no more threads (the sandbox's process limit): fewer reads in flight
        threads.append(exited)
    if not threads:  # not even one: read here
        exited = _thread.allocate_lock()
        exited.acquire()
        work(exited)
        threads.append(exited)
    reached, err = hi, None
    for i, o in enumerate(starts):
        done[i].acquire()  # every piece up to the last one taken is read: pieces are taken in order
        if result[i] is not True:
            reached, err = o, result[i]
            stop.append(1)
            break
        h.update(mv[o:min(hi, o + _READ_PIECE)])
    for exited in threads:
        exited.acquire()
    if isinstance(err, EOFError):
        raise err
    return reached


_thp = None


def _huge_pages():
    """Whether the kernel gives transparent huge pages to memory that asks for them."""
    global _thp
    if _thp is None:
        try:
            with open("/sys/kernel/mm/transparent_hugepage/enabled") as f:
                _thp = "[never]" not in f.read()
        except OSError:
            _thp = False
    return _thp


# What a pickle names when only dill's unpickler loads it as dill meant: dill's own reconstructors (functions,
# classes and code by value) and the session's main module (which dill.Unpickler maps to the session).
_DILL_NAMES = (b"dill", b"__main__", b"__builtin__")
_SEAM = max(map(len, _DILL_NAMES)) - 1


class _PickleChunks:
    """A file for the pickler: its bytes become P records. It notes whether they name what only dill loads."""

    def __init__(self, out):
        self.out = out
        self.dill = False
        self.tail = b""

    def _scan(self, b):
        if self.dill:
            return
        if len(b) >= 1 << 20:  # a large bytes, str or buffer payload written on its own: data, never a name
            self.tail = b""
            return
        if not isinstance(b, (bytes, bytearray)):
            b = bytes(b)  # a frame (the pickler writes its frames as memoryviews)
        if any(n in b or n in self.tail + b[:_SEAM] for n in _DILL_NAMES):
            self.dill = True
        self.tail = b[-_SEAM:]

    def write(self, b):
        self._scan(b)
        if len(b) >= 1 << 20:
            self.out.direct(b"P", memoryview(b))
        else:
            self.out.record(b"P", bytes(b))
        return len(b)


def _dill():
    """Import dill. Its import asks tempfile for the temporary directory, which probes each candidate by writing a
    file in it: on a sandbox whose disk quota is full every probe fails and the import raises, so no session
    could be saved (a pause failed) or loaded. The probe is skipped for the import only (TMPDIR, else /tmp), and
    tempfile is left as the session had it."""
    if "dill" in sys.modules:
        return sys.modules["dill"]
    import tempfile
    saved = tempfile.tempdir
    if saved is None:
        tempfile.tempdir = os.environ.get("TMPDIR") or "/tmp"
    try:
        import dill
    finally:
        tempfile.tempdir = saved
    return dill


# A str of this many characters or more is saved as a U record beside its variable's pickle (_BigStrs).
_BIG_STR = 1 << 20


def _str_layout():
    """Where a compact str's characters start from its address (its id) on this interpreter, for ASCII strs and
    for the others, and where its state (kind, compact, ascii bits) is; () if this interpreter's strs are not laid
    out as that assumes, checked on strs of each kind. sys.getsizeof of a fresh str is the offset of its
    characters plus those and their terminating NUL."""
    global _STR_LAYOUT
    if _STR_LAYOUT is None:
        _STR_LAYOUT = ()
        probes = [(chr(97) * 3, 1, True), (chr(0xE9) * 3, 1, False), (chr(0x100) * 3, 2, False), (chr(0x10000) * 3, 4, False)]
        offs = {(ascii, sys.getsizeof(p) - 4 * kind) for p, kind, ascii in probes}
        if len(offs) == 2:
            layout = (dict(offs)[True], dict(offs)[False], 4 * ctypes.sizeof(ctypes.c_ssize_t))
            _STR_LAYOUT = layout  # for _str_kind
            if not all(_str_kind(p) == (kind, ascii) for p, kind, ascii in probes):
                _STR_LAYOUT = ()
    return _STR_LAYOUT


_STR_LAYOUT = None
_STR_CODECS = {1: "latin-1", 2: "utf-16-le", 4: "utf-32-le"}


def _str_kind(s):
    """(bytes per character, ASCII) from s's state, or None for a str that is not compact (the state's bits as
    CPython 3.3-3.13 lay them out: interned 2, kind 3, compact 1, ascii 1)."""
    state = ctypes.c_uint32.from_address(id(s) + _STR_LAYOUT[2]).value
    if not (state >> 5) & 1:
        return None
    return (state >> 2) & 7, bool((state >> 6) & 1)


def _memory(addr, n, writable):
    """A memoryview of n bytes at addr (format B), which does not own them."""
    f = ctypes.pythonapi.PyMemoryView_FromMemory
    f.argtypes, f.restype = (ctypes.c_void_p, ctypes.c_ssize_t, ctypes.c_int), ctypes.py_object
    return f(addr, n, 0x200 if writable else 0x100)  # PyBUF_WRITE, PyBUF_READ


def _str_chars(s):
    """(code, a read-only memoryview of s's characters where CPython holds them) for a large str, code as in a U
    record; None if s is not a compact str laid out as this interpreter's are (its first and last characters and
    its terminating NUL are checked where the layout says they are), and then it is pickled as any str."""
    layout = _str_layout()
    kind = layout and _str_kind(s)
    if not kind or kind[0] not in _STR_CODECS or kind[1] != s.isascii():
        return None
    kind, ascii = kind
    n = len(s)
    k = min(n, 64)
    addr = id(s) + layout[0 if ascii else 1]
    codec = _STR_CODECS[kind]
    try:
        if (ctypes.string_at(addr, k * kind) != s[:k].encode(codec, "surrogatepass")
                or ctypes.string_at(addr + (n - k) * kind, (k + 1) * kind) != s[n - k:].encode(codec, "surrogatepass") + bytes(kind)):
            return None
    except UnicodeEncodeError:
        return None
    return (0 if ascii else kind), _memory(addr, n * kind, False)


def _new_str(n, code):
    """A new str of n characters of a U record's code, and a writable memoryview of its characters, to be filled
    before the str is used (it is no str until then: its hash is not computed yet, and nothing else holds it)."""
    layout = _str_layout()
    if not layout:
        raise ValueError("session stream: this interpreter's strs are not laid out as the stream's loader knows")
    f = ctypes.pythonapi.PyUnicode_New
    f.argtypes, f.restype = (ctypes.c_ssize_t, ctypes.c_uint32), ctypes.py_object
    s = f(n, {0: 0x7F, 1: 0xFF, 2: 0xFFFF, 4: 0x10FFFF}[code])
    return s, _memory(id(s) + layout[0 if code == 0 else 1], n * (code or 1), True)


class _BigStrs:
    """The large strs of one variable's pickle, each written once as a U record straight from its memory, and
    pickled as a persistent id (its number in the variable) in its place. Pickled as a str, it would be encoded to
    UTF-8 in one piece as it is saved, and decoded from a buffer of that size as it loads: twice its size in
    memory each way, and a resume of a str holding over half a sandbox's memory was killed on every try. The
    loader makes the str and reads its characters into it (_StreamIn.string)."""

    def __init__(self, out):
        self.out, self.ids = out, {}

    def pid(self, obj):
        """The persistent id of obj, a large str (written now, the first time it is met), or None if it cannot be
        written so."""
        seen = self.ids.get(id(obj))
        if seen is not None:
            return seen[0]
        chars = _str_chars(obj)
        if chars is None:
            return None
        code, mv = chars
        k = len(self.ids)
        self.ids[id(obj)] = k, obj  # held: a str an object's __reduce__ made could go, and its id be another's
        with mv:
            self.out.direct(b"U", mv, bytes((code,)))
        return k


def _session_pickler(needs):
    """dill's pickler as the session is saved with it; needs is told of the packages the stream needs imported to
    load (only numpy is looked for): a resume may then be given an interpreter that imported them ahead (see
    _preload)."""
    import importlib
    dill = _dill()
    is_installed = getattr(dill._dill, "_is_builtin_module", None)

    class Pickler(dill.Pickler):
        big_strs = None  # the variable's _BigStrs

        def persistent_id(self, obj):
            if type(obj) is str and len(obj) >= _BIG_STR and self.big_strs is not None:
                return self.big_strs.pid(obj)
            return None

        # Three kinds of object are saved otherwise than dill saves them, each so that it loads as dill's save
        # would and its pickle needs no dill to load (a resume then need not import dill, ~30 ms):
        # - numpy arrays: dill uses its own _create_array and ndarray.__reduce__, which copies the data into the
        #   pickle; numpy's protocol 5 reduce instead puts a large contiguous array's data in an out-of-band
        #   buffer (data frames' blocks are such arrays);
        # - modules of the installation (stdlib, dist-packages): dill saves a reference its _import_module
        #   resolves, importlib's import_module resolves the same (a user's own module, e.g. /root/m.py, dill
        #   saves with its state: left to dill);
        # - builtin types (slice, in a data frame's index): dill saves _load_type("slice"), a reference to
        #   builtins.slice loads the same object.
        def save(self, obj, save_persistent_id=True):
            t = type(obj)
            np = sys.modules.get("numpy")
            if np is not None and "numpy" not in needs and (
                    (getattr(t, "__module__", None) or "").partition(".")[0] == "numpy"
                    or t is _types.ModuleType and obj.__name__.partition(".")[0] == "numpy"):
                needs.add("numpy")
            if np is not None and t is np.ndarray:
                save = lambda: self.save_reduce(*obj.__reduce_ex__(5), obj=obj)
            elif (t is _types.ModuleType and is_installed is not None
                    and obj.__name__ not in ("dill", "dill._dill", "__main__")
                    and (obj.__name__ == "builtins" or is_installed(obj))):
                save = lambda: self.save_reduce(importlib.import_module, (obj.__name__,), obj=obj)
            elif t is type and obj.__module__ == "builtins" and getattr(_builtins, obj.__qualname__, None) is obj:
                save = lambda: dill._dill.StockPickler.save_global(self, obj)
            else:
                dill.Pickler.save(self, obj, save_persistent_id)
                return
            x = self.memo.get(id(obj))
            if x is not None:
                self.write(self.get(x[0]))
                return
            save()

    return Pickler


class _NeedsDill(Exception):
    """Raised by the plain pickler for an object that dill saves otherwise than the standard pickler."""


def _dill_at_top(value):
    """Whether a variable is itself what only dill saves as the session needs (a function or class the session
    defined, code), or an instance of such a class: the plain pickler would stop at once."""
    if isinstance(value, (type, _types.FunctionType)):
        return getattr(value, "__module__", None) in ("__main__", None)
    return isinstance(value, _types.CodeType) or getattr(type(value), "__module__", None) == "__main__"


def _plain_pickler(needs):
    """The C pickler, for the variables that hold nothing dill saves otherwise than it: ~5 times faster than dill's
    (a pure-Python pickler), and its memo takes ~24 bytes per object saved where dill's takes ~200 (a dict of two
    million strings needed over 1 GiB beside its 300 MB to be saved by dill). It stops (_NeedsDill, or the
    standard pickler's own error) at the first object dill saves its own way: whatever the session defined
    (functions, classes and their instances: by value in dill), the session's own namespace (a reference in
    dill), modules that are not installed, and every object the standard pickler cannot save (code, cells,
    locks, files, descriptors, properties: dill has savers of its own for them; of the types dill saves its own
    way, those the standard pickler saves too come back the same). The caller then saves the variable with
    dill. Numpy arrays go out of band as in dill's path; needs is told of numpy as there. It needs no dill: a
    session of data is saved without importing it (~30 ms)."""
    import importlib, pickle

    class Plain(pickle.Pickler):
        big_strs = None  # the variable's _BigStrs

        def persistent_id(self, obj):
            if obj is _ns:
                raise _NeedsDill("the session's namespace")
            if type(obj) is str and len(obj) >= _BIG_STR and self.big_strs is not None:  # called for every object
                return self.big_strs.pid(obj)
            return None

        def reducer_override(self, obj):
            t = type(obj)
            if "numpy" not in needs and (
                    (getattr(t, "__module__", None) or "").partition(".")[0] == "numpy"
                    or t is _types.ModuleType and obj.__name__.partition(".")[0] == "numpy"):
                needs.add("numpy")
            if t is _types.ModuleType:
                if obj.__name__ not in ("dill", "dill._dill", "__main__") and (
                        obj.__name__ == "builtins" or _installed(obj)):
                    return importlib.import_module, (obj.__name__,)
                raise _NeedsDill("module " + obj.__name__)
            if isinstance(obj, type) or t is _types.FunctionType:
                if getattr(obj, "__module__", None) in ("__main__", None):
                    raise _NeedsDill("defined in the session")
                return NotImplemented  # by reference, as dill saves what it can import (or PicklingError)
            if getattr(t, "__module__", None) == "__main__":
                raise _NeedsDill(t.__name__)
            return NotImplemented

    return Plain


def _installed(module):
    """Whether module is the installation's (the standard library, dist-packages): dill's test of it
    (_is_builtin_module), without dill."""
    if not hasattr(module, "__file__"):
        return True
    f = module.__file__
    if not isinstance(f, str):
        return False
    import importlib.machinery
    real = os.path.realpath(f)
    return (any(real.startswith(os.path.realpath(getattr(sys, n)))
                for n in ("base_prefix", "base_exec_prefix", "exec_prefix", "prefix", "real_prefix") if hasattr(sys, n))
            or f.endswith(tuple(importlib.machinery.EXTENSION_SUFFIXES)) or "site-packages" in f)


def _picklers():
    """What saves the session: the packages its loading needs (a set both picklers add to), the plain pickler,
    and a function that makes dill's, for the variables that need it (dill is imported then, not before)."""
    needs = set()
    return needs, _plain_pickler(needs), lambda: _session_pickler(needs)


def _snapshot_stream(fd, picklers=None):
    """Write the session's variables to fd as a session stream; return what could not be saved and the packages
    its loading will import (see _session_pickler)."""
    needs, Plain, make_dill = picklers or _picklers()
    Pickler = None
    out = _StreamOut(fd)
    skipped = []
    try:
        for name, value in list(_ns.items()):
            if name in _SKIP_NAMES:
                continue
            vname = name.encode("utf-8", "surrogatepass")
            out.record(b"V", vname)

            def oob(buf):
                with buf.raw() as m:
                    if m.nbytes < 1 << 16:
                        return True  # a small array's data stays in the pickle
                    out.direct(b"B", m)
                return False

            def dump(cls, chunks):
                p = cls(chunks, protocol=5, buffer_callback=oob)
                p.big_strs = _BigStrs(out)  # each attempt its own: a dropped one's U records go with it
                p.dump(value)

            chunks = _PickleChunks(out)
            if not _dill_at_top(value):
                try:
                    dump(Plain, chunks)
                    out.record(b"E" if chunks.dill else b"S")
                    continue
                except OSError:
                    raise
                except Exception:  # dill's to save (or to fail): what came since V is dropped, and V comes again
                    out.record(b"X", json.dumps({"name": name, "retry": True}).encode())
                    out.record(b"V", vname)
                    chunks = _PickleChunks(out)
            try:
                if Pickler is None:
                    Pickler = make_dill()
                dump(Pickler, chunks)
            except OSError:
                raise  # the stream itself failed: the pause fails
            except Exception as e:  # an object that does not serialize: listed, never silently dropped
                entry = {"name": name, "type": type(value).__name__, "reason": ("%s: %s" % (type(e).__name__, e))[:300]}
                skipped.append(entry)
                out.record(b"X", json.dumps(entry).encode())
                continue
            out.record(b"E" if chunks.dill else b"S")
        meta = {"cwd": os.getcwd(), "env": dict(os.environ), "execution_count": _count, "cells": _cell_sources()}
        out.record(b"M", json.dumps(meta).encode("utf-8", "surrogatepass"))
        out.record(b"Z")
        out.flush()
    finally:
        os.close(fd)
    return skipped, sorted(needs)


def _save_session(fd, moved):
    """Write the session to fd as a session stream from a copy of this interpreter forked for the save, and
    answer what _snapshot_stream answers. Saving takes memory beyond the session's own: the pickler's memo holds
    every object it saved, and in a copy the objects whose reference counts it touches are copied on write
    (a dict of two million strings using 60% of a sandbox's memory took it past its limit). Done in place, the
    kernel then killed the interpreter, and the session a pause was to keep was lost. The copy is the one the
    kernel kills first (oom_score_adj 1000), and when the server passes moved (a pipe it writes one byte to
    once it has moved the copy into a memory budget of its own, see runtime.SaveCopier) only the copy's memory
    counts there: a save that needs too much fails, and this interpreter runs on untouched. The copy also saves
    the session as it was at one instant, whatever the session's threads do meanwhile. Where no copy can be
    forked (the sandbox's tasks limit), the save runs in place as before."""
    try:
        r, w = os.pipe()
    except OSError:
        r = None
    pid = -1
    if r is not None:
        sys.stdout.flush()
        sys.stderr.flush()
        try:
            pid = os.fork()
        except OSError:
            os.close(r)
            os.close(w)
    if pid == 0:
        status = 1
        try:
            gc.disable()  # a collection writes to every object's header: it would copy the whole heap
            os.close(r)
            try:
                with open("/proc/self/oom_score_adj", "w") as f:
                    f.write("1000")
            except OSError:
                pass
            picklers = _picklers()
            if any(_dill_at_top(v) for k, v in list(_ns.items()) if k not in _SKIP_NAMES):
                _dill()  # it will be needed: imported (~30 ms) while the server moves this process
            if moved is not None:
                os.read(moved, 1)  # b"\x01": moved; end of file: the server could not, the save runs here
                os.close(moved)
            skipped, needs = _snapshot_stream(fd, picklers)
            _write_all(w, json.dumps({"skipped": skipped, "needs": needs}).encode() + b"\n")
            status = 0
        except BaseException as e:
            try:
                _write_all(w, json.dumps({"error": "%s: %s" % (type(e).__name__, e),
                                          "errno": getattr(e, "errno", None) if isinstance(e, OSError) else None,
                                          "memory": isinstance(e, MemoryError)}).encode() + b"\n")
            except BaseException:
                pass
        os._exit(status)
    if moved is not None:
        os.close(moved)
    if pid < 0:
        return _snapshot_stream(fd)
    os.close(w)
    try:
        if moved is not None:
            _send({"type": "save_copy", "pid": pid})
        out, gave_up = bytearray(), False
        p = select.poll()
        p.register(r, select.POLLIN)
        p.register(fd, 0)  # POLLERR once no one reads the stream: the server gave up on the save
        while True:
            ready = dict(p.poll())
            if ready.get(r):
                data = os.read(r, 1 << 16)
                out += data
                if not data or data.endswith(b"\n"):  # not its end of file: what it started may hold the pipe
                    break
            elif ready.get(fd):
                gave_up = True
                os.kill(pid, signal.SIGKILL)
                break
    finally:
        os.close(r)
        os.close(fd)  # with the copy's end closed, the server's read of the stream ends
        status = None
        try:
            _, status = os.waitpid(pid, 0)
        except ChildProcessError:  # reaped by the session's own code (os.wait in a thread, SIGCHLD ignored)
            pass
    if gave_up:
        raise OSError(32, "the server stopped reading the session stream")
    try:
        res = json.loads(bytes(out)) if out else None
    except ValueError:
        res = None
    if res is not None and "error" not in res:
        return res["skipped"], res["needs"]
    if res is not None:
        if res.get("memory"):
            raise MemoryError("saving the session ran out of memory: " + res["error"])
        if res.get("errno") is not None:
            raise OSError(res["errno"], res["error"])
        raise RuntimeError(res["error"])
    how = "ended"
    if status is not None and os.WIFSIGNALED(status):
        how = "was killed by signal %d" % os.WTERMSIG(status)
        if os.WTERMSIG(status) == signal.SIGKILL:
            raise MemoryError("the copy of the interpreter saving the session was killed (SIGKILL: out of memory, "
                              "or killed from outside); the session is as it was")
    elif status is not None:
        how = "exited with status %d" % os.WEXITSTATUS(status)
    raise RuntimeError("the copy of the interpreter saving the session %s without an answer" % how)


# Variables that numpy, its BLAS or OpenMP read as they are imported (the thread counts among them).
_IMPORT_ENV = ("OPENBLAS_", "GOTO", "OMP_", "MKL_", "BLIS_", "VECLIB_", "NUMPY_", "NPY_", "NUMEXPR_")

# What _preload imported, to tell later whether an import now would find the same: the import-time variables
# and the packages' names.
_preloaded = None

# Modules a session's load itself imports (the unpickler), imported with the packages a zygote kept for resumes
# imports ahead: a resume's interpreter imports them anyway. (The stored file's checksum, CRC-32C, is the native
# helper's, which a zygote has loaded for its handover; hashlib, ~3.6 MiB of OpenSSL, only for an older snapshot.)
_LOAD_IMPORTS = ("pickle",)


def _preload(modules):
    """Import modules ahead of a session that will need them (a zygote kept for resumes), and what loading a
    session imports: nothing of the session (its variables, execution count, cells) changes."""
    global _preloaded
    import importlib
    for m in list(modules) + list(_LOAD_IMPORTS):
        importlib.import_module(m)
    _preloaded = {"env": _import_env(), "top": list(modules)}


def _import_env():
    return {k: v for k, v in os.environ.items() if k.startswith(_IMPORT_ENV)}


def _preload_holds():
    """Whether what _preload imported is what the session would import now, with its env, cwd and files (the
    sandbox this zygote's interpreter moved into); if not, the agent starts a fresh interpreter instead. The
    sandbox's image is the zygote's, and the host looked at the sandbox's own files (its layer) for any that
    change these imports (namespaces/startup.go) before it gave it this interpreter. What is left to tell here:
    the import-time variables, and the working directory, first on sys.path, where a module of a package's name
    would be found first. Each is a few look-ups: an interpreter that looked at every file of numpy spent 18-52 ms
    of a resume on a VM here (its page faults and the sandbox's fresh overlay)."""
    if _preloaded is None:
        return True
    if _import_env() != _preloaded["env"]:
        return False
    import importlib, importlib.machinery
    importlib.invalidate_caches()  # the path finders' listings are of the zygote's directories (its cwd among them)
    if "" in sys.path:
        suffixes = importlib.machinery.all_suffixes()
        for name in _preloaded["top"]:
            if any(os.path.lexists(name + s) for s in [""] + suffixes):
                return False
    return True


def _restore_stream(fd, alg="crc32c"):
    """Load a session stream from fd (a pipe or the stored file) into the session; return what failed to load,
    and for a stored file its size and checksum (alg) as read (_StreamIn.digest)."""
    failed, digest, meta = [], None, None
    try:
        f = _StreamIn(fd, alg)
        if f.read(len(_MAGIC)) != _MAGIC:
            raise ValueError("not a session stream")
        hdr = f.header()
        while True:
            kind, n = hdr
            hdr = None
            if kind == b"V":
                hdr = _load_variable(f, f.read(n).decode("utf-8", "surrogatepass"), failed)
            elif kind == b"M":
                meta = json.loads(f.read(n))
            elif kind == b"Z":
                f.skip(n)
                break
            elif kind in b"_PBESXU":  # outside a variable (no writer puts them there): passed over
                f.skip(n)
            else:
                raise ValueError("session stream: unknown record %r" % kind)
            if hdr is None:
                hdr = f.header()
        digest = f.digest()
    finally:
        os.close(fd)
    _apply_meta(meta or {})
    return failed, digest


# A variable's pickle up to this size is collected whole and then loaded by its E or S record (S: without dill);
# a larger one is loaded as it streams (_PickleIn), so that a resume needs about the session's size in memory,
# not three times a large variable's (its chunks, their join and the object built from it).
_LOAD_WHOLE = 8 << 20


def _var_failed(failed, name, e):
    failed.append({"name": name, "reason": ("%s: %s" % (type(e).__name__, e))[:300]})


def _load_variable(f, name, failed):
    """Load the variable whose V record was just read into the session, or list it in failed. At an X record what
    came since V is dropped (the pause could not save it, or saves it again from a new V: a large pickle dropped
    so has been unpickled part way as it streamed, and is thrown away). Return the header of a record that ended
    the variable early (V, M, Z), if one did: the stream goes on from there."""
    chunks, bufs, strs, size = [], [], [], 0
    while True:
        kind, n = f.header()
        if kind == b"P":
            if size + n > _LOAD_WHOLE:
                return _load_streaming(f, name, failed, chunks, bufs, strs, n)
            chunks.append(f.read(n))
            size += n
        elif kind == b"B":
            bufs.append(f.buffer(n))
        elif kind == b"U":
            strs.append(f.string(n))
        elif kind == b"_":
            f.skip(n)
        elif kind in (b"E", b"S"):
            f.skip(n)
            try:
                if kind == b"E":
                    unpickler = _dill().Unpickler
                else:
                    import pickle
                    unpickler = pickle.Unpickler
                u = unpickler(io.BytesIO(b"".join(chunks)), buffers=bufs)
                u.persistent_load = _str_loader(strs)
                _ns[name] = u.load()
            except Exception as e:
                _var_failed(failed, name, e)
            return None
        elif kind == b"X":
            f.skip(n)
            return None
        else:
            _var_failed(failed, name, ValueError("the session stream ends the variable early"))
            return kind, n


def _str_loader(strs):
    """The unpickler's persistent_load for a variable whose large strs are strs (so far: it may grow)."""
    def load(pid):
        if type(pid) is not int or not 0 <= pid < len(strs):
            raise ValueError("the variable's pickle names a string the stream does not hold: %r" % (pid,))
        return strs[pid]
    return load


def _load_streaming(f, name, failed, chunks, bufs, strs, left):
    """Load a variable with a large pickle as it streams: its collected chunks, buffers and strs, then the rest of
    its records (the first of them a P record of left bytes, its header read) as the unpickler reads them. Its E
    or S record comes last, so dill's unpickler loads it (it loads a standard pickle as the standard one would)."""
    r = _PickleIn(f, chunks, bufs, strs, left)
    del chunks[:], bufs[:], strs[:]  # the reader's now: each chunk is freed once read
    value, err = None, None
    try:
        try:
            unpickler = _dill().Unpickler
        except ImportError:
            import pickle
            unpickler = pickle.Unpickler
        u = unpickler(r, buffers=r.buffers())
        u.persistent_load = _str_loader(r.strs)
        value = u.load()
    except Exception as e:
        if r.broken is not None:
            raise r.broken  # the stream itself failed (cut short, a read error): the whole load fails
        err = e
    if r.drain() and err is None:  # pickle data or buffers the unpickler did not take: a corrupt stream
        err = ValueError("the variable's pickle goes on after its end")
    kind, n = r.end
    if kind in (b"E", b"S"):
        f.skip(n)
        if err is None:
            _ns[name] = value
        else:
            _var_failed(failed, name, err)
        return None
    if kind == b"X":
        f.skip(n)
        return None
    _var_failed(failed, name, ValueError("the session stream ends the variable early"))
    return kind, n


class _PickleIn:
    """The file dill's unpickler reads a large variable's pickle from (_load_streaming): the chunks collected
    already, then the variable's further P records straight from the session stream as it asks for them. The
    C unpickler reads a large bytes or bytearray payload with readinto, into the object it builds: the payload
    goes from the stream into that object with no copy between. The B records passed on the way are queued for
    its buffers, the U records' strs made for its persistent ids; the pickler writes each before the P chunk with
    its NEXT_BUFFER or BINPERSID opcode."""

    def __init__(self, f, chunks, bufs, strs, left):
        from collections import deque
        self.f = f
        self.chunks = deque(chunks)  # pickle bytes read from the stream, not yet handed out
        self.pos = 0  # of chunks[0]: how much is handed out
        self.left = left  # bytes of the current P record not yet read from the stream
        self.bufs = deque(bufs)
        self.strs = list(strs)  # the variable's large strs, in order: its persistent ids number them
        self.end = None  # (kind, length) of the record that ended the variable's P and B records, once read
        self.broken = None  # an error of the stream itself, which fails the whole load, not just this variable

    def _io(self, fn, *args):
        try:
            return fn(*args)
        except BaseException as e:
            self.broken = e
            raise

    def _record(self):
        """Read the next record of the variable (a B record whole, a P record's header): False at its end."""
        if self.end is not None:
            return False
        kind, n = self._io(self.f.header)
        if kind == b"P":
            self.left = n
        elif kind == b"B":
            self.bufs.append(self._io(self.f.buffer, n))
        elif kind == b"U":
            self.strs.append(self._io(self.f.string, n))
        elif kind == b"_":
            self._io(self.f.skip, n)
        else:
            self.end = kind, n
            return False
        return True

    def _avail(self):
        """Whether pickle bytes are left before the variable's end."""
        while not self.chunks and not self.left:
            if not self._record():
                return False
        return True

    def _front(self, k):
        """Take k bytes off the first chunk."""
        c, p = self.chunks[0], self.pos
        self.pos += k
        if self.pos == len(c):
            self.chunks.popleft()
            self.pos = 0
            if not p:
                return c
        return c[p:p + k]

    def readinto(self, b):
        with memoryview(b) as m, m.cast("B") as mv:
            n, got = len(mv), 0
            while got < n and self._avail():
                if self.chunks:
                    k = min(n - got, len(self.chunks[0]) - self.pos)
                    mv[got:got + k] = self._front(k)
                else:
                    k = min(n - got, self.left)
                    self._io(self.f.readinto, mv[got:got + k])  # a large payload: into the object being built
                    self.left -= k
                got += k
            return got

    def read(self, n=-1):
        if n is None or n < 0:
            n = sys.maxsize
        parts = []
        while n and self._avail():
            if self.chunks:  # a whole chunk (a frame, say) is handed out as it is
                k = min(n, len(self.chunks[0]) - self.pos)
                parts.append(self._front(k))
            else:  # from the current P record: a large one (a long str's payload) into fresh memory of its own
                k = min(n, self.left)
                parts.append(self._io(self.f.buffer if k >= _BIG else self.f.read, k))
                self.left -= k
            n -= k
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def readline(self):
        parts = []
        while self._avail():
            if not self.chunks:
                k = min(self.left, 1 << 16)
                self.chunks.append(self._io(self.f.read, k))
                self.left -= k
            c = self.chunks[0]
            i = c.find(b"\n", self.pos)
            parts.append(self._front((len(c) if i < 0 else i + 1) - self.pos))
            if i >= 0:
                break
        return b"".join(parts)

    def buffers(self):
        """The out-of-band buffers, in order, for the unpickler's buffers=."""
        while True:
            while not self.bufs:
                # Queued already, the pickler writing a B record before the P chunk that asks for it: read ahead
                # to the next B all the same, keeping the pickle bytes on the way for the unpickler.
                if self.left:
                    self.chunks.append(self._io(self.f.read, self.left))
                    self.left = 0
                if not self._record():
                    return
            yield self.bufs.popleft()

    def drain(self):
        """Pass the rest of the variable's records up to its end; return whether pickle bytes or buffers were
        left (after a successful load: a corrupt stream)."""
        left = bool(self.bufs) or sum(map(len, self.chunks)) > self.pos
        self.chunks.clear()
        self.bufs.clear()
        while True:
            if self.left:
                left = True
                self.f.skip(self.left)
                self.left = 0
            if self.end is not None:
                return left
            kind, n = self.f.header()
            if kind == b"P":
                self.left = n
            elif kind in (b"B", b"U", b"_"):
                left = left or kind in (b"B", b"U")
                self.f.skip(n)
            else:
                self.end = kind, n


def _restore(directory):
    """Load what _snapshot saved into the session; return the names that failed to load."""
    dill = _dill()
    with open(os.path.join(directory, "session.json")) as f:
        meta = json.load(f)
    failed = []
    for name, fname in meta["names"]:
        try:
            with open(os.path.join(directory, fname), "rb") as f:
                _ns[name] = dill.load(f)
        except Exception as e:
            failed.append({"name": name, "reason": ("%s: %s" % (type(e).__name__, e))[:300]})
    _apply_meta(meta)
    return failed


# At most this many characters of cell source go into a snapshot (the newest cells first).
_CELLS_LIMIT = 4 << 20


def _cell_sources():
    """The cells' sources (for tracebacks after a resume): [[name, source], ...], newest first, bounded."""
    cells, total = [], 0
    names = [n for n in linecache.cache if n.startswith("<cell ")]
    for name in sorted(names, key=lambda n: int(n[6:-1]) if n[6:-1].isdigit() else 0, reverse=True):
        entry = linecache.cache.get(name)
        src = "".join(entry[2]) if entry else ""
        total += len(src)
        if total > _CELLS_LIMIT:
            break
        cells.append([name, src])
    return cells


def _apply_meta(meta):
    """Give the session the cwd, env, execution count and cell sources a snapshot recorded."""
    global _count
    for name, src in meta.get("cells") or []:
        linecache.cache[name] = (len(src), None, src.splitlines(True), name)
    try:
        os.chdir(meta.get("cwd") or "/root")
    except OSError:
        pass
    os.environ.clear()
    os.environ.update(meta.get("env") or {})
    _count = meta.get("execution_count", _count)


def _serve():
    while True:
        try:
            line = _rfile.readline()
        except KeyboardInterrupt:
            continue
        if not line:
            return
        req = json.loads(line)
        _reap()
        op = req.get("op")
        try:
            if op == "run" and req.get("warm"):
                resp = _warm()
            elif op == "run":
                resp = _run(req.get("code", ""), req.get("env"))
            elif op == "fork":
                resp = _fork(req)
            elif op == "configure":
                os.environ.update(req.get("env") or {})
                # The C library read the time zone (TZ, else /etc/localtime) once, as this interpreter (a warm
                # sandbox's, a zygote's) started: read it again with the sandbox's env, as a fresh start would.
                import time
                time.tzset()
                try:
                    os.chdir(req.get("cwd") or "/root")
                except OSError:
                    pass
                resp = {"type": "result", "preload_holds": _preload_holds()}
            elif op == "snapshot":
                fd = _rfile.take_fd()
                moved = _rfile.take_fd() if req.get("budget") else None
                skipped, needs = _save_session(fd, moved)
                resp = {"type": "result", "skipped": skipped, "preload": needs}
            elif op == "preload":
                _preload(req.get("modules") or [])
                resp = {"type": "result"}
            elif op == "restore" and req.get("stream"):
                skipped, digest = _restore_stream(_rfile.take_fd(), req.get("sum") or "crc32c")
                resp = {"type": "result", "skipped": skipped}
                if digest:
                    resp["read"] = digest
            elif op == "restore":  # a snapshot made before session streams: one pickle file per variable
                resp = {"type": "result", "skipped": _restore(req["dir"])}
            elif op == "discard_sigint":  # the agent interrupted the last run: see _discard_sigint
                resp = {"type": "result", "value": repr(_discard_sigint())}
            elif op == "ping":
                resp = {"type": "result", "pid": os.getpid()}
            elif op == "fork_check":
                resp = {"type": "result", "fork_hooks": _fork_hooks}
            else:
                resp = {"type": "result", "error": {"name": "ProtocolError", "value": "unknown op %r" % op, "traceback": ""}}
        except KeyboardInterrupt as e:  # an interrupt that landed just after user code ended
            resp = {"type": "result", "value": None, "execution_count": _count,
                    "error": {"name": "KeyboardInterrupt", "value": str(e), "traceback": ""}}
        except Exception as e:  # an op that failed (a broken session stream, say): the interpreter lives on
            resp = {"type": "result", "error": {"name": type(e).__name__, "value": str(e)[:1000], "traceback": ""}}
        _send(resp)


def main():
    global _sock, _rfile
    try:
        with open("/proc/self/oom_score_adj", "w") as f:
            f.write("500")
    except OSError:
        pass
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    _sock = socket.socket(fileno=3)
    _rfile = _Reader(_sock)
    sys.stdin = open(os.devnull)
    del sys.argv[:]
    sys.argv.append("")
    _confine()
    _send_fd({"type": "ready", "pid": os.getpid()}, _install_filter())
    _serve()


main()
