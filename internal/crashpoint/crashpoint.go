// Package crashpoint owns ramify's test-only crash hook: a server started with RAMIFY_TEST_CRASH_AT=<point> kills
// itself with SIGKILL when it reaches that named point of a multi-step operation (a fork after its children were
// spawned, a pause half-way through its snapshot, ...), so that tests can check what a restart does with
// half-done work at that exact phase. It is compiled into every build and inert unless the variable is set.
package crashpoint

import (
	"os"
	"syscall"
)

// Env is the environment variable naming the point at which the server kills itself.
const Env = "RAMIFY_TEST_CRASH_AT"

// The points, named after the phase just completed.
const (
	CreateAfterLayer      = "create-after-layer"       // a new sandbox's layer exists, nothing runs yet
	CreateAfterSpawn      = "create-after-spawn"       // its family, agent, cgroup, veth and layer exist, no record has its handle
	ForkAfterChildren     = "fork-after-children"      // the children's layers, agents, cgroups and veths exist
	ForkAfterInterpreters = "fork-after-interpreters"  // the parent's interpreter forked into the children's cgroups
	PauseAfterSession     = "pause-after-session"      // the interpreter's session is in the snapshot store
	PauseAfterLayer       = "pause-after-layer"        // the sandbox is frozen and its layer.tar stored, no manifest
	SnapshotBeforePublish = "snapshot-before-publish"  // a local snapshot object is written in full to its temp file
	ResumeAfterCreate     = "resume-after-create"      // the resumed sandbox runs, its record still says resuming
	MergeAfterCommit      = "merge-after-commit"       // the merged records are written, the runtime has not swapped
	MergeAfterSwap        = "merge-after-swap"         // the records are written and the runtime swapped
	ForkPausedAfterCopies = "fork-paused-after-copies" // a paused sandbox's snapshot is copied for each child, no record
	DestroyAfterRetire    = "destroy-after-retire"     // a deleted sandbox's record is gone, its processes and files not
)

var at = os.Getenv(Env)

// Hit kills this process with SIGKILL if RAMIFY_TEST_CRASH_AT names point; otherwise it does nothing.
func Hit(point string) {
	if at != "" && at == point {
		syscall.Kill(os.Getpid(), syscall.SIGKILL) //nolint:errcheck // it does not return
		select {}
	}
}
