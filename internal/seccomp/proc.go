//go:build linux

package seccomp

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// errNoPidfd reports that an fd is not a pidfd.
var errNoPidfd = errors.New("not a pidfd")

// readProcFile reads a small /proc file. It is cheaper than os.ReadFile on /proc (no fstat, a 4 KiB first read
// instead of 512 bytes), which matters on the path of every trapped call.
func readProcFile(path string) ([]byte, error) {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, &os.PathError{Op: "open", Path: path, Err: err}
	}
	defer unix.Close(fd)
	buf := make([]byte, 4096)
	n := 0
	for {
		if n == len(buf) {
			buf = append(buf, make([]byte, len(buf))...)
		}
		m, err := unix.Read(fd, buf[n:])
		if err != nil {
			if err == unix.EINTR {
				continue
			}
			return nil, &os.PathError{Op: "read", Path: path, Err: err}
		}
		if m == 0 {
			return buf[:n], nil
		}
		n += m
	}
}

// procPath joins procRoot, a pid and the rest of a path.
func (s *Supervisor) procPath(pid int, rest ...string) string {
	return filepath.Join(append([]string{s.procRoot, strconv.Itoa(pid)}, rest...)...)
}

// sandboxKey returns what identifies the sandbox (cgroup) of pid: the pids controller line of /proc/<pid>/cgroup on
// cgroup v1, else the unified "0::" line, else the whole file.
func (s *Supervisor) sandboxKey(pid int) (string, error) {
	data, err := readProcFile(s.procPath(pid, "cgroup"))
	if err != nil {
		return "", fmt.Errorf("read cgroup of %d: %w", pid, err)
	}
	return cgroupKey(data), nil
}

// cgroupKey extracts the sandbox identity from the content of a /proc/<pid>/cgroup file.
func cgroupKey(data []byte) string {
	unified := ""
	for _, line := range strings.Split(string(data), "\n") {
		parts := strings.SplitN(line, ":", 3)
		if len(parts) != 3 {
			continue
		}
		for _, c := range strings.Split(parts[1], ",") {
			if c == "pids" {
				return "pids:" + parts[2]
			}
		}
		if parts[0] == "0" && parts[1] == "" {
			unified = "0::" + parts[2]
		}
	}
	if unified != "" {
		return unified
	}
	return "whole:" + string(data)
}

// processGroup returns the process group of pid (field 5 of /proc/<pid>/stat).
func (s *Supervisor) processGroup(pid int) (int, error) {
	data, err := readProcFile(s.procPath(pid, "stat"))
	if err != nil {
		return 0, fmt.Errorf("read stat of %d: %w", pid, err)
	}
	// The command name (field 2) is in parentheses and may contain anything, so parse after the last ')'.
	i := bytes.LastIndexByte(data, ')')
	if i < 0 {
		return 0, fmt.Errorf("parse stat of %d: no ')'", pid)
	}
	fields := strings.Fields(string(data[i+1:]))
	if len(fields) < 3 { // state, ppid, pgrp
		return 0, fmt.Errorf("parse stat of %d: %d fields after the name", pid, len(fields))
	}
	pgrp, err := strconv.Atoi(fields[2])
	if err != nil {
		return 0, fmt.Errorf("parse stat of %d: pgrp: %w", pid, err)
	}
	return pgrp, nil
}

// statusField returns the integer value of a "Name:\tvalue" line of a /proc status-like file.
func statusField(data []byte, name string) (int, bool) {
	for _, line := range strings.Split(string(data), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok || k != name {
			continue
		}
		n, err := strconv.Atoi(strings.TrimSpace(v))
		if err != nil {
			return 0, false
		}
		return n, true
	}
	return 0, false
}

// threadGroup returns the tgid of the thread tid.
func (s *Supervisor) threadGroup(tid int) (int, error) {
	data, err := readProcFile(s.procPath(tid, "status"))
	if err != nil {
		return 0, fmt.Errorf("read status of %d: %w", tid, err)
	}
	tgid, ok := statusField(data, "Tgid")
	if !ok {
		return 0, fmt.Errorf("parse status of %d: no Tgid", tid)
	}
	return tgid, nil
}

// pidfdTarget reads an fdinfo file and returns the pid its pidfd refers to (-1: the process exited; 0: it is not in
// this PID namespace). It returns errNoPidfd when the file has no "Pid:" line.
func pidfdTarget(fdinfoPath string) (int, error) {
	data, err := readProcFile(fdinfoPath)
	if err != nil {
		return 0, fmt.Errorf("read %s: %w", fdinfoPath, err)
	}
	pid, ok := statusField(data, "Pid")
	if !ok {
		return 0, fmt.Errorf("%s: %w", fdinfoPath, errNoPidfd)
	}
	return pid, nil
}

// isPidfdLink reports whether the target of a /proc/<pid>/fd/<fd> link names a pidfd.
func isPidfdLink(link string) bool {
	return link == "anon_inode:[pidfd]" || strings.HasPrefix(link, "pidfd:")
}

// listPids returns the numeric entries of procRoot (thread-group leaders).
func (s *Supervisor) listPids() ([]int, error) {
	entries, err := os.ReadDir(s.procRoot)
	if err != nil {
		return nil, fmt.Errorf("list %s: %w", s.procRoot, err)
	}
	var pids []int
	for _, e := range entries {
		if n, err := strconv.Atoi(e.Name()); err == nil && n > 0 {
			pids = append(pids, n)
		}
	}
	return pids, nil
}

// exists reports whether path exists; errors other than "does not exist" are returned.
func exists(path string) (bool, error) {
	_, err := os.Lstat(path)
	if err == nil {
		return true, nil
	}
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	return false, err
}
