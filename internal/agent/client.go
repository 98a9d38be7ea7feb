package agent

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"sync"
	"time"

	"golang.org/x/sys/unix"

	"github.com/ramify-dev/ramify/internal/errdefs"
)

// Client is the server's side of the agent protocol for one sandbox. It keeps a few idle connections for
// reuse; each call uses one connection exclusively.
type Client struct {
	dial func(ctx context.Context) (net.Conn, error)

	mu   sync.Mutex
	idle []*clientConn
}

type clientConn struct {
	c net.Conn
	r *bufio.Reader
}

// NewClient returns a client that opens connections with dial.
func NewClient(dial func(ctx context.Context) (net.Conn, error)) *Client {
	return &Client{dial: dial}
}

// ErrAgentGone reports that the agent could not be reached or hung up mid-call. It is also
// errdefs.ErrUnavailable (HTTP 503): an agent that died is restarted by the health watcher within a second
// (its sandbox's interpreter state lost, which the next run_code reports), so the call may be made again.
var ErrAgentGone error = agentGone{}

type agentGone struct{}

func (agentGone) Error() string {
	return "sandbox agent is not reachable (killed, or being restarted: try again in a second)"
}

func (agentGone) Is(target error) bool { return target == errdefs.ErrUnavailable }

// ErrInterpreterLost matches (errors.Is) the error of a call that needed the sandbox's interpreter and found it
// dead (killed, out of memory since the last call) or saw it die: its state is lost, and the next run_code
// starts a fresh interpreter. Such an error is also errdefs.ErrConflict: the sandbox's state, not ramify, stops
// the call (HTTP 409).
var ErrInterpreterLost = errors.New("the sandbox's interpreter exited and its state is lost")

// ErrTasksFull matches (errors.Is) the error of a fork whose sandbox's tasks limit (max_procs) was full, so that
// its interpreter could not fork. It is also errdefs.ErrConflict: the sandbox's state stops the call (HTTP 409).
var ErrTasksFull = errors.New("the sandbox's tasks limit is full")

// answerError is an agent's error answer.
type answerError struct {
	msg  string
	lost bool // the interpreter's state was lost (Event.Lost)
	full bool // the sandbox's tasks limit was full (Event.TasksFull)
}

func (e *answerError) Error() string { return "agent: " + e.msg }

func (e *answerError) Is(target error) bool {
	switch target {
	case ErrInterpreterLost:
		return e.lost
	case ErrTasksFull:
		return e.full
	case errdefs.ErrConflict:
		return e.lost || e.full
	}
	return false
}

func (c *Client) get(ctx context.Context) (*clientConn, error) {
	c.mu.Lock()
	if n := len(c.idle); n > 0 {
		cc := c.idle[n-1]
		c.idle = c.idle[:n-1]
		c.mu.Unlock()
		return cc, nil
	}
	c.mu.Unlock()
	conn, err := c.dial(ctx)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrAgentGone, err)
	}
	return &clientConn{c: conn, r: bufio.NewReaderSize(conn, 64<<10)}, nil
}

func (c *Client) put(cc *clientConn) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.idle) >= 4 {
		cc.c.Close()
		return
	}
	c.idle = append(c.idle, cc)
}

// Close closes idle connections.
func (c *Client) Close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, cc := range c.idle {
		cc.c.Close()
	}
	c.idle = nil
}

// roundTrip sends req and calls onEvent for every non-terminal event; it returns the terminal event.
// Cancelling ctx closes the connection (the agent then stops the work it was doing for it where it can).
func (c *Client) roundTrip(ctx context.Context, req Request, onEvent func(Event)) (Event, error) {
	cc, err := c.get(ctx)
	if err != nil {
		return Event{}, err
	}
	ev, err := c.call(ctx, cc, req, onEvent)
	if err != nil {
		cc.c.Close()
		// A pooled connection may have gone stale (agent restarted): retry once on a fresh one when nothing
		// was received yet, and only when the agent cannot have acted on the request: it was never sent, or the
		// operation may be repeated (a run_code or fork_repl that reached an agent which died must not run twice).
		var se *staleErr
		if errors.As(err, &se) && (!se.sent || idempotent(req.Op)) {
			conn, derr := c.dial(ctx)
			if derr != nil {
				return Event{}, fmt.Errorf("%w: %v", ErrAgentGone, derr)
			}
			cc = &clientConn{c: conn, r: bufio.NewReaderSize(conn, 64<<10)}
			ev, err = c.call(ctx, cc, req, onEvent)
			if err != nil {
				cc.c.Close()
				return Event{}, err
			}
		} else {
			return Event{}, err
		}
	}
	c.put(cc)
	return ev, nil
}

// roundTripWithFiles is roundTrip on a connection of its own whose request carries files' descriptors
// (SCM_RIGHTS, at most 253): the way a session stream's pipe, or a fork's namespaces, reach the agent. It takes
// the files and closes them once sent, so that the other end of a pipe sees EOF when the agent's side is done.
func (c *Client) roundTripWithFiles(ctx context.Context, req Request, files []*os.File, onEvent func(Event)) (Event, error) {
	closeAll := func() {
		for _, f := range files {
			f.Close()
		}
	}
	defer closeAll()
	if len(files) > maxPassedFDs {
		return Event{}, fmt.Errorf("%d descriptors for one request (at most %d)", len(files), maxPassedFDs)
	}
	conn, err := c.dial(ctx)
	if err != nil {
		return Event{}, fmt.Errorf("%w: %v", ErrAgentGone, err)
	}
	defer conn.Close()
	uc, ok := conn.(*net.UnixConn)
	if !ok {
		return Event{}, errors.New("agent connection cannot carry a file")
	}
	b, err := json.Marshal(req)
	if err != nil {
		return Event{}, err
	}
	fds := make([]int, len(files))
	for i, f := range files {
		fds[i] = int(f.Fd())
	}
	_, _, err = uc.WriteMsgUnix(append(b, '\n'), unix.UnixRights(fds...), nil)
	closeAll()
	if err != nil {
		return Event{}, fmt.Errorf("%w: %v", ErrAgentGone, err)
	}
	cc := &clientConn{c: conn, r: bufio.NewReaderSize(conn, 64<<10)}
	return c.events(ctx, cc, onEvent)
}

type staleErr struct {
	err  error
	sent bool // the request was written: the agent may have received it
}

// idempotent reports whether an agent operation may be sent again after a failure that leaves unknown whether the
// agent received it.
func idempotent(op string) bool { return op == OpPing }

func (s *staleErr) Error() string { return s.err.Error() }
func (s *staleErr) Unwrap() error { return s.err }

func (c *Client) call(ctx context.Context, cc *clientConn, req Request, onEvent func(Event)) (Event, error) {
	b, err := json.Marshal(req)
	if err != nil {
		return Event{}, err
	}
	b = append(b, '\n')
	stop := context.AfterFunc(ctx, func() { cc.c.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	if _, err := cc.c.Write(b); err != nil {
		if ctx.Err() != nil {
			return Event{}, ctx.Err()
		}
		return Event{}, &staleErr{err: err}
	}
	return c.events(ctx, cc, onEvent)
}

// events reads a call's events up to the terminal one.
func (c *Client) events(ctx context.Context, cc *clientConn, onEvent func(Event)) (Event, error) {
	stop := context.AfterFunc(ctx, func() { cc.c.SetDeadline(time.Unix(1, 0)) })
	defer stop()
	first := true
	for {
		line, err := readLine(cc.r, maxEvent)
		if err != nil {
			if ctx.Err() != nil {
				return Event{}, ctx.Err()
			}
			if first {
				return Event{}, &staleErr{err: fmt.Errorf("%w: %v", ErrAgentGone, err), sent: true}
			}
			return Event{}, fmt.Errorf("%w: %v", ErrAgentGone, err)
		}
		first = false
		var ev Event
		if err := json.Unmarshal(line, &ev); err != nil {
			return Event{}, fmt.Errorf("agent sent a bad event: %w", err)
		}
		if ev.Terminal() {
			if ev.Type == "error" {
				return ev, &answerError{msg: ev.Message, lost: ev.Lost, full: ev.TasksFull}
			}
			return ev, nil
		}
		if onEvent != nil {
			onEvent(ev)
		}
	}
}
