package namespaces

import (
	"bufio"
	"fmt"
	"os"
	"sync"
	"syscall"
	"time"
)

// logSink collects what families' inits and agents write to their stdout and stderr into one host file
// (<data-dir>/logs/sandboxes.log). Each family writes into a pipe of its own that the server reads: a process in
// a sandbox never holds a descriptor of a host file, which, taken by sandbox code, would let it write to the
// host's disk or forge and truncate the log. A line is prefixed with its family's id and cut at maxLogLine.
//
// The pipes live only as long as the server: a family that outlives a server restart writes into a pipe with no
// reader. Inits and agents ignore SIGPIPE, so they lose those lines, nothing else.
type logSink struct {
	mu sync.Mutex
	f  *os.File
}

const maxLogLine = 16 << 10

func openLogSink(path string) (*logSink, error) {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND|syscall.O_CLOEXEC, 0o600)
	if err != nil {
		return nil, err
	}
	return &logSink{f: f}, nil
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
	s.mu.Lock()
	defer s.mu.Unlock()
	fmt.Fprintf(s.f, "%s %s: %s%s\n", time.Now().UTC().Format("2006-01-02T15:04:05.000Z"), family, line, suffix)
}

func (s *logSink) Close() error { return s.f.Close() }
