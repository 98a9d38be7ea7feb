package agent

import _ "embed"

// forkChildHelper is forkchild/forkchild.c compiled (scripts/build-forkchild): the set-up each fork child calls
// right after the fork (repl.py _ForkHelper). It is committed, as the seccomp program is, so that a build needs
// no C compiler; TestForkChildHelperIsCurrent checks it was built from the source beside it.
//
//go:embed forkchild/forkchild_amd64.so
var forkChildHelper []byte
