package namespaces

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"slices"
	"sync"
	"syscall"
	"time"

	"github.com/ramify-dev/ramify/internal/runtime"
)

// logSink collects what families' inits and agents write to their stdout and stderr into one host file
// (<data-dir>/logs/sandboxes.log). Each family writes into a pipe of its own that the server reads: a process in
// a sandbox never holds a descriptor of a host file, which, taken by sandbox code, would let it write to the
// host's disk or forge and truncate the log. A line is prefixed with its family's id and cut at maxLogLine.
//
// The pipes live only as long as the server: a family that outlives a server restart writes into a pipe with no
// reader. Inits and agents ignore SIGPIPE, so they lose those lines, nothing else.
//
// Besides the file, the sink keeps the last lines of each sandbox in memory for GET /v1/sandboxes/{id}/logs: an
// agent tags its lines with host=<its hostname> (which follows its agent through a merge), and lines without a tag
// (the init's, a spare agent's before it is claimed) go to the family's ring. Bounded: ringLines lines per ring,
// at most maxRings rings (the least recently written is dropped first).
type logSink struct {
	mu    sync.Mutex
	f     *os.File
	rings map[string]*logRing
	order []string // ring keys, least recently written first
}

const (
	ringLines = 200
	maxRings  = 2048
)

// logRing is one sandbox's (or family's) last lines.
type logRing struct {
	lines []runtime.LogLine
	next  int // where the next line goes once full
}

func (r *logRing) add(l runtime.LogLine) {
	if len(r.lines) < ringLines {
		r.lines = append(r.lines, l)
		return
	}
	r.lines[r.next] = l
	r.next = (r.next + 1) % ringLines
}

func (r *logRing) all() []runtime.LogLine {
	if r == nil {
		return nil
	}
	return append(append([]runtime.LogLine{}, r.lines[r.next:]...), r.lines[:r.next]...)
}

const maxLogLine = 16 << 10

func openLogSink(path string) (*logSink, error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND|syscall.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, err
	}
	return &logSink{f: f, rings: map[string]*logRing{}}, nil
}

// writer returns the write end of a new pipe whose lines go to the log under family's name. The caller passes it
// to the process it starts and closes its own copy.
func (s *logSink) writer(family string) (*os.File, error) {
	r, w, err := os.Pipe()
	if err != nil {
		return nil, fmt.Errorf("log pipe: %w", err)
	}
	go s.copy(family, r)
	return w, nil
}

func (s *logSink) copy(family string, r *os.File) {
	defer r.Close()
	br := bufio.NewReaderSize(r, maxLogLine)
	for {
		line, isPrefix, err := br.ReadLine()
		if len(line) > 0 {
			s.write(family, line, isPrefix)
		}
		if isPrefix {
			// Drop the rest of an over-long line.
			for isPrefix && err == nil {
				_, isPrefix, err = br.ReadLine()
			}
		}
		if err != nil {
			return
		}
	}
}

func (s *logSink) write(family string, line []byte, cut bool) {
	suffix := ""
	if cut {
		suffix = " [line cut]"
	}
	now := time.Now().UTC()
	s.mu.Lock()
	defer s.mu.Unlock()
	fmt.Fprintf(s.f, "%s %s: %s%s\n", now.Format("2006-01-02T15:04:05.000Z"), family, line, suffix)
	key, src := "family "+family, "family"
	if h := hostTag(line); h != "" {
		key, src = "host "+h, "agent"
	}
	s.ring(key).add(runtime.LogLine{Time: now, Source: src, Text: string(line) + suffix})
}

// ring returns the ring for key, made (and the oldest dropped past maxRings) when new, and marks it the most
// recently written. The caller holds s.mu.
func (s *logSink) ring(key string) *logRing {
	if r := s.rings[key]; r != nil {
		if i := slices.Index(s.order, key); i >= 0 {
			s.order = append(slices.Delete(s.order, i, i+1), key)
		}
		return r
	}
	if len(s.order) >= maxRings {
		delete(s.rings, s.order[0])
		s.order = slices.Delete(s.order, 0, 1)
	}
	r := &logRing{}
	s.rings[key] = r
	s.order = append(s.order, key)
	return r
}

// hostTag is the value of a host= attribute in a log line of slog's text format ("" when none).
func hostTag(line []byte) string {
	_, rest, ok := bytes.Cut(line, []byte(" host="))
	if !ok {
		return ""
	}
	end := bytes.IndexByte(rest, ' ')
	if end < 0 {
		end = len(rest)
	}
	return string(rest[:end])
}

// lines returns the recent lines of the sandbox with hostname host and of its family, oldest first.
func (s *logSink) lines(host, family string) []runtime.LogLine {
	s.mu.Lock()
	out := append(s.rings["host "+host].all(), s.rings["family "+family].all()...)
	s.mu.Unlock()
	slices.SortStableFunc(out, func(a, b runtime.LogLine) int { return a.Time.Compare(b.Time) })
	return out
}

func (s *logSink) Close() error { return s.f.Close() }

// Logs returns the recent log lines of the sandbox with this hostname and of its fork family (runtime.LogKeeper).
func (r *Runtime) Logs(hostname, family string) []runtime.LogLine {
	if r.logs == nil {
		return nil
	}
	return r.logs.lines(hostname, family)
}
