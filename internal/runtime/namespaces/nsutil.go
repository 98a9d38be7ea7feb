package namespaces

import (
	"fmt"
	"net"
	"os"
	goruntime "runtime"
	"strconv"
	"strings"
	"sync"

	"golang.org/x/sys/unix"
)

var (
	hostNetOnce sync.Once
	hostNetFD   int
	hostNetErr  error
)

func hostNetNS() (int, error) {
	hostNetOnce.Do(func() {
		hostNetFD, hostNetErr = unix.Open("/proc/self/ns/net", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	})
	return hostNetFD, hostNetErr
}

// dialAbstract connects to the abstract unix socket name inside the network namespace nsFD. The socket is
// created on a thread that has entered that namespace; the thread returns to the host namespace before it is
// released.
func dialAbstract(nsFD int, name string) (net.Conn, error) {
	return dialAbstractType(nsFD, name, unix.SOCK_STREAM)
}

func dialAbstractType(nsFD int, name string, typ int) (net.Conn, error) {
	host, err := hostNetNS()
	if err != nil {
		return nil, err
	}
	goruntime.LockOSThread()
	if err := unix.Setns(nsFD, unix.CLONE_NEWNET); err != nil {
		goruntime.UnlockOSThread()
		return nil, fmt.Errorf("enter netns: %w", err)
	}
	fd, serr := unix.Socket(unix.AF_UNIX, typ|unix.SOCK_CLOEXEC, 0)
	if err := unix.Setns(host, unix.CLONE_NEWNET); err != nil {
		// This thread cannot be trusted any more: keep it locked so the runtime discards it.
		if serr == nil {
			unix.Close(fd)
		}
		return nil, fmt.Errorf("return to host netns: %w", err)
	}
	goruntime.UnlockOSThread()
	if serr != nil {
		return nil, serr
	}
	if err := unix.Connect(fd, &unix.SockaddrUnix{Name: "@" + name}); err != nil {
		unix.Close(fd)
		return nil, err
	}
	f := os.NewFile(uintptr(fd), name)
	defer f.Close()
	return net.FileConn(f)
}

// procStart returns the start time of pid (field 22 of /proc/pid/stat), or an error if it does not exist.
func procStart(pid int) (uint64, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, err
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, fmt.Errorf("bad stat for %d", pid)
	}
	fields := strings.Fields(s[i+1:])
	// fields[0] is state (field 3); starttime is field 22 -> index 19
	if len(fields) < 20 {
		return 0, fmt.Errorf("short stat for %d", pid)
	}
	if fields[0] == "Z" || fields[0] == "X" {
		return 0, fmt.Errorf("process %d is a zombie", pid)
	}
	return strconv.ParseUint(fields[19], 10, 64)
}

// alive reports whether pid is running and is the process that started at start.
func alive(pid int, start uint64) bool {
	if pid <= 0 {
		return false
	}
	s, err := procStart(pid)
	return err == nil && s == start
}

// hostPidOf finds the host pid of the child of parent whose pid in the family's PID namespace is nsPid.
func hostPidOf(parent, nsPid int) (int, error) {
	if pid := hostPidsOf(parent, []int{nsPid})[nsPid]; pid != 0 {
		return pid, nil
	}
	return 0, fmt.Errorf("no child of %d has namespace pid %d", parent, nsPid)
}

// hostPidsOf maps each of nsPids to the host pid of the child of parent that has it in the family's PID
// namespace (absent: no such child): one listing of parent's children, and one /proc read per child until all
// are found, however many are looked for. The children are read newest first: those looked for have just been
// started (a spawned agent, new spares), and a family init's older children are its sandboxes' agents.
func hostPidsOf(parent int, nsPids []int) map[int]int {
	want := make(map[int]bool, len(nsPids))
	for _, p := range nsPids {
		want[p] = true
	}
	out := make(map[int]int, len(nsPids))
	kids := childPids(fmt.Sprintf("/proc/%d", parent))
	for i := len(kids) - 1; i >= 0 && len(out) < len(want); i-- {
		if ns := nsPidOf(kids[i]); want[ns] {
			out[ns] = kids[i]
		}
	}
	return out
}

// childPids lists the children of the process at proc ("/proc/<pid>" or "/proc/self"), whichever of its threads
// started them, as pids of the reader's PID namespace; each thread's children oldest first (the order of its
// children list).
func childPids(proc string) []int {
	var out []int
	// Not filepath.Glob(proc+"/task/*/children"): it would list each task's directory (~50 entries, each a
	// dentry procfs makes) to find "children" in it.
	d, err := os.Open(proc + "/task")
	if err != nil {
		return nil
	}
	tids, _ := d.Readdirnames(-1)
	d.Close()
	for _, tid := range tids {
		b, err := os.ReadFile(proc + "/task/" + tid + "/children")
		if err != nil {
			continue
		}
		for _, f := range strings.Fields(string(b)) {
			if pid, _ := strconv.Atoi(f); pid > 0 {
				out = append(out, pid)
			}
		}
	}
	return out
}

// nsPidOf returns pid's pid in its innermost PID namespace (the last NSpid field), or 0.
func nsPidOf(pid int) int {
	f := statusField(pid, "NSpid")
	if len(f) == 0 {
		return 0
	}
	n, _ := strconv.Atoi(f[len(f)-1])
	return n
}

// threadCount returns how many threads process pid has (its Threads field).
func threadCount(pid int) (int, error) {
	f := statusField(pid, "Threads")
	if len(f) != 1 {
		return 0, fmt.Errorf("threads of process %d: not found", pid)
	}
	return strconv.Atoi(f[0])
}

// statusField returns the words of field name in /proc/<pid>/status; nil if there is none.
func statusField(pid int, name string) []string {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return nil
	}
	for _, line := range strings.Split(string(b), "\n") {
		if k, v, ok := strings.Cut(line, ":"); ok && k == name {
			return strings.Fields(v)
		}
	}
	return nil
}

// openNetNS opens the network namespace of process pid (a host pid), close-on-exec.
func openNetNS(pid int) (int, error) {
	return unix.Open(fmt.Sprintf("/proc/%d/ns/net", pid), unix.O_RDONLY|unix.O_CLOEXEC, 0)
}
