package sshd

import (
	"context"
	"encoding/binary"
	"fmt"
	"io"
	"regexp"
	"sync"
	"time"

	"github.com/pkg/sftp"
	"golang.org/x/crypto/ssh"

	"github.com/ramify-dev/ramify/internal/agent"
)

// session is one session channel: its requests set up a PTY and environment, then start a shell, a command or
// the sftp subsystem (one of them, once).
type session struct {
	srv *Server
	id  string
	ch  ssh.Channel

	env     map[string]string
	pty     bool
	rows    uint16
	cols    uint16
	started bool

	mu      sync.Mutex
	running *agent.Session // set once the command runs: window changes go to it
}

// safeEnv are the variables a client may set (env requests, OpenSSH's SendEnv), as OpenSSH's default AcceptEnv
// allows: the locale, and the terminal's color support.
var safeEnv = regexp.MustCompile(`^(LANG|LANGUAGE|LC_[A-Z_]+|COLORTERM|TZ)$`)

// outputGrace is how long a session waits, once its command has exited, for output still on its way (or held
// by a process it left running) before it sends the exit status and closes.
const outputGrace = 200 * time.Millisecond

func (s *session) serve(reqs <-chan *ssh.Request) {
	defer s.ch.Close()
	done := make(chan struct{}) // closed when the channel is gone: a command that starts after it is ended at once
	for req := range reqs {
		ok := s.request(req, done)
		if req.WantReply {
			req.Reply(ok, nil)
		}
	}
	// Under s.mu, as run checks done and sets running: either run sees done closed, or the session is closed here.
	s.mu.Lock()
	close(done)
	running := s.running
	s.mu.Unlock()
	if running != nil {
		running.Close()
	}
}

// request handles one channel request and says whether it was accepted.
func (s *session) request(req *ssh.Request, done chan struct{}) bool {
	switch req.Type {
	case "env":
		var kv struct{ Name, Value string }
		if ssh.Unmarshal(req.Payload, &kv) != nil || !safeEnv.MatchString(kv.Name) || s.started {
			return false
		}
		if s.env == nil {
			s.env = map[string]string{}
		}
		s.env[kv.Name] = kv.Value
		return true
	case "pty-req":
		var p struct {
			Term             string
			Cols, Rows, W, H uint32
			Modes            string
		}
		if ssh.Unmarshal(req.Payload, &p) != nil || s.started {
			return false
		}
		s.pty, s.cols, s.rows = true, clamp(p.Cols), clamp(p.Rows)
		if s.env == nil {
			s.env = map[string]string{}
		}
		if p.Term != "" {
			s.env["TERM"] = p.Term
		}
		return true
	case "window-change":
		var w struct{ Cols, Rows, W, H uint32 }
		if ssh.Unmarshal(req.Payload, &w) != nil {
			return false
		}
		s.mu.Lock()
		defer s.mu.Unlock()
		s.cols, s.rows = clamp(w.Cols), clamp(w.Rows)
		if s.running != nil {
			s.running.Resize(s.rows, s.cols) //nolint:errcheck // the session may be ending
		}
		return true
	case "shell", "exec":
		if s.started {
			return false
		}
		var argv []string
		if req.Type == "exec" {
			var c struct{ Command string }
			if ssh.Unmarshal(req.Payload, &c) != nil {
				return false
			}
			argv = []string{"/bin/sh", "-c", c.Command}
		}
		s.started = true
		if req.WantReply { // the reply must precede the command's output
			req.Reply(true, nil)
			req.WantReply = false
		}
		go s.run(argv, done)
		return true
	case "subsystem":
		var sub struct{ Name string }
		if ssh.Unmarshal(req.Payload, &sub) != nil || sub.Name != "sftp" || s.started {
			return false
		}
		s.started = true
		if req.WantReply {
			req.Reply(true, nil)
			req.WantReply = false
		}
		go s.sftp()
		return true
	}
	// x11-req, auth-agent-req@openssh.com, signal, break ...: refused.
	return false
}

func clamp(n uint32) uint16 {
	if n > 0xffff {
		return 0xffff
	}
	return uint16(n)
}

// run starts argv (nil: the login shell) in the sandbox and pipes it to the channel until it exits, then sends
// its exit status and closes the channel.
func (s *session) run(argv []string, done chan struct{}) {
	s.mu.Lock()
	req := agent.SessionRequest{Argv: argv, Env: s.env, Tty: s.pty, Rows: s.rows, Cols: s.cols}
	s.mu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	sess, err := s.srv.svc.Session(ctx, s.id, req)
	cancel()
	if err != nil {
		fmt.Fprintf(s.ch.Stderr(), "ramify: %v\r\n", err)
		s.exit(255)
		return
	}
	s.mu.Lock()
	s.running = sess
	select {
	case <-done: // the channel closed meanwhile
		s.mu.Unlock()
		sess.Close()
		return
	default:
	}
	if sess.Pty != nil {
		sess.Resize(s.rows, s.cols) //nolint:errcheck // a window change may have come while it started
	}
	s.mu.Unlock()
	defer sess.Close()
	if !sess.Started() {
		io.WriteString(s.ch.Stderr(), sess.Message())
		code, _ := sess.Wait()
		s.exit(code)
		return
	}
	var out sync.WaitGroup
	copyOut := func(w io.Writer, r io.Reader) {
		out.Add(1)
		go func() {
			defer out.Done()
			io.Copy(w, r) //nolint:errcheck // ends at EOF (EIO for a PTY whose processes are gone) or a close
		}()
	}
	if sess.Pty != nil {
		copyOut(s.ch, sess.Pty)
		go io.Copy(sess.Pty, s.ch) //nolint:errcheck // ends with the channel or the session
	} else {
		copyOut(s.ch, sess.Stdout)
		copyOut(s.ch.Stderr(), sess.Stderr)
		go func() {
			io.Copy(sess.Stdin, s.ch) //nolint:errcheck // ends with the client's EOF
			sess.Stdin.Close()
		}()
	}
	code, err := sess.Wait()
	if err != nil { // the client went away, or the sandbox was paused or destroyed
		s.srv.log.Debug("ssh session", "sandbox", s.id, "err", err)
		code = 255
	}
	drained := make(chan struct{})
	go func() { out.Wait(); close(drained) }()
	t := time.NewTimer(outputGrace)
	select {
	case <-drained:
	case <-t.C:
	}
	t.Stop()
	s.exit(code)
}

// exit sends the exit status and closes the channel.
func (s *session) exit(code int) {
	var b [4]byte
	binary.BigEndian.PutUint32(b[:], uint32(code))
	s.ch.SendRequest("exit-status", false, b[:]) //nolint:errcheck // the client may be gone
	s.ch.CloseWrite()
	s.ch.Close()
}

// sftp serves the sftp subsystem on the channel from the sandbox's files (see handlers).
func (s *session) sftp() {
	h := &fsHandlers{svc: s.srv.svc, id: s.id}
	rs := sftp.NewRequestServer(s.ch, sftp.Handlers{FileGet: h, FilePut: h, FileCmd: h, FileList: h},
		sftp.WithStartDirectory("/root"))
	if err := rs.Serve(); err != nil && err != io.EOF {
		s.srv.log.Debug("sftp", "sandbox", s.id, "err", err)
	}
	s.exit(0) // before rs.Close, which closes the channel: scp fails without an exit status
	rs.Close()
}
