package agent

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// An interactive session (OpSession) is a command whose standard streams the server drives itself, as an SSH
// server does: on a new pseudo-terminal of the sandbox (Tty), or on three pipes. The agent starts the command
// from the spawner thread (so it runs filtered and confined like every sandbox process) and answers "ok" with
// the streams' descriptors attached (SCM_RIGHTS): the PTY's master, or the write end of stdin and the read ends
// of stdout and stderr. It keeps no copy: the server's reads and writes go straight to the kernel, and a resize
// is the server's TIOCSWINSZ on the master. When the command's main process exits the agent sends "exit" with
// its status. When the server closes the connection (before or after that), the agent kills every process the
// session started (see procTree): a session leaves nothing running behind it.

// session serves a session request on c (which it then owns; r reads the rest of it): the ok event, sent with the
// streams' descriptors, then exit, or the terminal event of a command that could not start.
func (a *Agent) session(c *net.UnixConn, r io.Reader, req Request) {
	cmd, ours, theirs, err := a.sessionCommand(req)
	if err != nil {
		writeEvent(c, Event{Type: "error", Message: "session: " + err.Error()}, nil)
		return
	}
	err = a.startFiltered(cmd)
	closeFiles(theirs)
	if err != nil {
		closeFiles(ours)
		code := 126
		if errors.Is(err, exec.ErrNotFound) || errors.Is(err, os.ErrNotExist) {
			code = 127
		}
		writeEvent(c, Event{Type: "exit", ExitCode: code, Stderr: err.Error() + "\n"}, nil)
		return
	}
	token := cmd.Env[len(cmd.Env)-1][len(ExecIDEnv)+1:]
	tree := newProcTree("/proc", cmd.Process.Pid, token) // before the process can be reaped
	stopTracking := tree.track()
	defer func() {
		stopTracking()
		tree.kill()
	}()
	fds := make([]int, len(ours))
	for i, f := range ours {
		fds[i] = int(f.Fd())
	}
	err = writeEvent(c, Event{Type: "ok", Pid: cmd.Process.Pid}, unix.UnixRights(fds...))
	closeFiles(ours)
	if err != nil {
		waitExit(cmd) //nolint:errcheck // killed by the deferred kill first
		return
	}
	hangup := make(chan struct{})
	go func() {
		io.Copy(io.Discard, r) //nolint:errcheck // the server sends nothing more: any end is a hang-up
		close(hangup)
	}()
	waited := make(chan error, 1)
	go func() { waited <- waitExit(cmd) }()
	select {
	case werr := <-waited:
		if writeEvent(c, Event{Type: "exit", ExitCode: exitCode(werr)}, nil) == nil {
			<-hangup
		}
	case <-hangup:
		stopTracking()
		tree.kill()
		<-waited
	}
}

// sessionCommand builds the session's command and its streams: ours go to the server, theirs to the command.
func (a *Agent) sessionCommand(req Request) (cmd *exec.Cmd, ours, theirs []*os.File, err error) {
	argv := req.Argv
	if len(argv) == 0 {
		argv = []string{loginShell(), "-l"}
	}
	cmd = exec.Command(argv[0], argv[1:]...)
	cmd.Dir = a.workdir(req.Cwd)
	cmd.Env = append(a.environ(req.Env), ExecIDEnv+"="+execToken()) // the token stays last (see session)
	if req.Tty {
		master, slave, err := openPty(req.Rows, req.Cols)
		if err != nil {
			return nil, nil, nil, err
		}
		cmd.Stdin, cmd.Stdout, cmd.Stderr = slave, slave, slave
		// A session of its own with the PTY as its controlling terminal (Ctty is the child's descriptor 0).
		cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
		return cmd, []*os.File{master}, []*os.File{slave}, nil
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	inR, inW, err := os.Pipe()
	if err != nil {
		return nil, nil, nil, err
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		closeFiles([]*os.File{inR, inW})
		return nil, nil, nil, err
	}
	errR, errW, err := os.Pipe()
	if err != nil {
		closeFiles([]*os.File{inR, inW, outR, outW})
		return nil, nil, nil, err
	}
	cmd.Stdin, cmd.Stdout, cmd.Stderr = inR, outW, errW
	return cmd, []*os.File{inW, outR, errR}, []*os.File{inR, outW, errW}, nil
}

// openPty opens a new pseudo-terminal of the sandbox's devpts instance (/dev/ptmx links to its ptmx) with the
// given window size (0: the kernel's default).
func openPty(rows, cols uint16) (master, slave *os.File, err error) {
	mfd, err := unix.Open("/dev/ptmx", unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("open /dev/ptmx: %w", err)
	}
	master = os.NewFile(uintptr(mfd), "/dev/ptmx")
	if err := unix.IoctlSetPointerInt(mfd, unix.TIOCSPTLCK, 0); err != nil {
		master.Close()
		return nil, nil, fmt.Errorf("unlock pty: %w", err)
	}
	sfd, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(mfd), unix.TIOCGPTPEER, unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC)
	if errno != 0 {
		master.Close()
		return nil, nil, fmt.Errorf("open pty peer: %w", errno)
	}
	if rows > 0 && cols > 0 {
		unix.IoctlSetWinsize(mfd, unix.TIOCSWINSZ, &unix.Winsize{Row: rows, Col: cols}) //nolint:errcheck // size stays default
	}
	return master, os.NewFile(sfd, "pty"), nil
}

// loginShell is root's shell in the sandbox's /etc/passwd, or /bin/sh.
func loginShell() string {
	b, err := os.ReadFile("/etc/passwd")
	if err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			f := strings.Split(line, ":")
			if len(f) == 7 && f[2] == "0" && f[6] != "" {
				if _, err := os.Stat(f[6]); err == nil {
					return f[6]
				}
			}
		}
	}
	return "/bin/sh"
}

func closeFiles(fs []*os.File) {
	for _, f := range fs {
		f.Close()
	}
}

// writeEvent writes one event line on c, with oob (descriptors) attached if not nil.
func writeEvent(c *net.UnixConn, ev Event, oob []byte) error {
	b, _ := json.Marshal(ev) //nolint:errchkjson // plain data
	_, _, err := c.WriteMsgUnix(append(b, '\n'), oob, nil)
	return err
}

// SessionRequest starts an interactive session (see Agent.session).
type SessionRequest struct {
	Argv       []string          // default: root's login shell, with -l
	Env        map[string]string // on top of the sandbox's (TERM for a PTY)
	Cwd        string            // default: the sandbox's
	Tty        bool
	Rows, Cols uint16 // the PTY's first window size
}

// Session is a started session as the server holds it. With a PTY, Pty is its master (read the output, write
// the input, resize with Resize); without, Stdin, Stdout and Stderr are the command's pipes. Close ends it: the
// agent kills whatever it left running.
type Session struct {
	Pty                   *os.File
	Stdin, Stdout, Stderr *os.File

	conn  net.Conn
	r     *bufio.Reader
	early *Event // the exit of a command that could not start
}

// Session starts a session on a connection of its own.
func (c *Client) Session(ctx context.Context, r SessionRequest) (*Session, error) {
	conn, err := c.dial(ctx)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrAgentGone, err)
	}
	s, err := startSession(ctx, conn, r)
	if err != nil {
		conn.Close()
		return nil, err
	}
	return s, nil
}

func startSession(ctx context.Context, conn net.Conn, r SessionRequest) (*Session, error) {
	uc, ok := conn.(*net.UnixConn)
	if !ok {
		return nil, errors.New("agent connection cannot carry a file")
	}
	stop := context.AfterFunc(ctx, func() { conn.Close() })
	defer stop()
	req := Request{Op: OpSession, Argv: r.Argv, Env: r.Env, Cwd: r.Cwd, Tty: r.Tty, Rows: r.Rows, Cols: r.Cols}
	b, _ := json.Marshal(req) //nolint:errchkjson // plain data
	if _, err := conn.Write(append(b, '\n')); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrAgentGone, err)
	}
	buf := make([]byte, 64<<10)
	oob := make([]byte, unix.CmsgSpace(3*4))
	n, oobn, _, _, err := uc.ReadMsgUnix(buf, oob)
	fds := Rights(oob[:oobn])
	files := make([]*os.File, len(fds))
	for i, fd := range fds {
		unix.SetNonblock(fd, true) //nolint:errcheck // a blocking file still works, only Close cannot interrupt a read
		files[i] = os.NewFile(uintptr(fd), "session")
	}
	if err != nil || n == 0 {
		closeFiles(files)
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, fmt.Errorf("%w: session: %v", ErrAgentGone, err)
	}
	s := &Session{conn: conn, r: bufio.NewReader(io.MultiReader(bytes.NewReader(buf[:n]), conn))}
	line, err := readLine(s.r, maxEvent)
	var ev Event
	if err == nil {
		err = json.Unmarshal(line, &ev)
	}
	switch {
	case err != nil:
		closeFiles(files)
		return nil, fmt.Errorf("%w: session: %v", ErrAgentGone, err)
	case ev.Type == "error":
		closeFiles(files)
		return nil, fmt.Errorf("agent: %s", ev.Message)
	case ev.Type == "exit":
		closeFiles(files)
		s.early = &ev
		return s, nil
	case r.Tty && len(files) == 1:
		s.Pty = files[0]
	case !r.Tty && len(files) == 3:
		s.Stdin, s.Stdout, s.Stderr = files[0], files[1], files[2]
	default:
		closeFiles(files)
		return nil, fmt.Errorf("session: the agent sent %d descriptors", len(files))
	}
	return s, nil
}

// Started reports whether the command started; if not, Wait answers its exit status (126, 127) and Message why.
func (s *Session) Started() bool { return s.early == nil }

// Message is why a command that did not start failed.
func (s *Session) Message() string {
	if s.early == nil {
		return ""
	}
	return s.early.Stderr
}

// Wait waits for the command's main process to exit and returns its exit status (128+n if killed by signal n).
func (s *Session) Wait() (int, error) {
	if s.early != nil {
		return s.early.ExitCode, nil
	}
	line, err := readLine(s.r, maxEvent)
	if err != nil {
		return -1, fmt.Errorf("%w: session: %v", ErrAgentGone, err)
	}
	var ev Event
	if err := json.Unmarshal(line, &ev); err != nil || ev.Type != "exit" {
		return -1, fmt.Errorf("session: unexpected answer %q", line)
	}
	return ev.ExitCode, nil
}

// Resize sets the PTY's window size (nothing without a PTY).
func (s *Session) Resize(rows, cols uint16) error {
	if s.Pty == nil {
		return nil
	}
	rc, err := s.Pty.SyscallConn()
	if err != nil {
		return err
	}
	var ierr error
	if err := rc.Control(func(fd uintptr) {
		ierr = unix.IoctlSetWinsize(int(fd), unix.TIOCSWINSZ, &unix.Winsize{Row: rows, Col: cols})
	}); err != nil {
		return err
	}
	return ierr
}

// Close ends the session: the agent kills every process it started. The streams are closed too.
func (s *Session) Close() error {
	closeFiles([]*os.File{s.Pty, s.Stdin, s.Stdout, s.Stderr})
	return s.conn.Close()
}
