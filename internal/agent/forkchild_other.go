//go:build !amd64

package agent

// forkChildHelper is nil where ramify's fork child helper has not been written for the architecture: an
// interpreter's first fork then fails, saying so (repl.py _ForkHelper).
var forkChildHelper []byte
