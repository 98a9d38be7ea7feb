// Package security is ramify's attack battery: every isolation claim of docs/security.md is tried here from inside
// real sandboxes (a real server, real namespaces, cgroups and network), as hostile code would try it. Each test
// must fail when the defence it names is taken away.
package security

import (
	"os"
	"testing"
)

func TestMain(m *testing.M) { os.Exit(m.Run()) }
