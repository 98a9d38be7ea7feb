package namespaces

import (
	"fmt"
	"os"
	"testing"

	"github.com/ramify-dev/ramify/internal/agent"
)

// TestMain lets the test binary play the family init and the agent, as the ramify binary does, since the
// runtime re-executes /proc/self/exe for both.
func TestMain(m *testing.M) {
	if len(os.Args) > 1 {
		switch os.Args[1] {
		case "__init":
			if err := InitMain(os.Args[2:]); err != nil {
				fmt.Fprintln(os.Stderr, err)
				os.Exit(1)
			}
			os.Exit(0)
		case "__agent":
			if err := agent.Main(os.Args[2:]); err != nil {
				fmt.Fprintln(os.Stderr, err)
				os.Exit(1)
			}
			os.Exit(0)
		}
	}
	os.Exit(m.Run())
}
