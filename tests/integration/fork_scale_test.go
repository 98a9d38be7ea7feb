package integration

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/ramify-dev/ramify/client"
	"github.com/ramify-dev/ramify/internal/testserver"
)

func TestForkOfOneGiBInterpreter(t *testing.T) {
	if testing.Short() {
		t.Skip("1 GiB array")
	}
	s := testserver.Start(t)
	ctx := ctxT(t)
	parent := create(t, s, &client.CreateRequest{MemMiB: 4096})
	// 1 GiB of float64 with known content.
	value(t, s, parent, "import numpy as np\nbig = np.arange(1 << 27, dtype=np.float64)\nint(big.nbytes)")
	start := time.Now()
	kids, err := s.Client.Fork(ctx, parent, 5)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("fork n=5 of a 1 GiB interpreter: %s", time.Since(start))
	want := value(t, s, parent, "float(big.sum())")
	for i, k := range kids {
		if v := value(t, s, k, "float(big.sum())"); v != want {
			t.Fatalf("child %d sum %s, want %s", i, v, want)
		}
		// A child's write is its own.
		value(t, s, k, fmt.Sprintf("big[0] = %d; 1", 1000+i))
	}
	for i, k := range kids {
		if v := value(t, s, k, "int(big[0])"); v != fmt.Sprint(1000+i) {
			t.Fatalf("child %d big[0] = %s", i, v)
		}
	}
	if v := value(t, s, parent, "int(big[0])"); v != "0" {
		t.Fatalf("parent big[0] = %s", v)
	}
}

func TestHundredForkMergeGenerations(t *testing.T) {
	s := testserver.Start(t)
	ctx := ctxT(t)
	root := create(t, s, nil)
	value(t, s, root, "gen = 0; 1")
	sh(t, s, root, "echo 0 > /root/gen.txt")
	const rounds = 100
	start := time.Now()
	for g := 1; g <= rounds; g++ {
		kids, err := s.Client.Fork(ctx, root, 2)
		if err != nil {
			t.Fatalf("generation %d: fork: %v", g, err)
		}
		win, lose := kids[g%2], kids[(g+1)%2]
		if v := value(t, s, win, fmt.Sprintf("gen += 1; gen")); v != fmt.Sprint(g) {
			t.Fatalf("generation %d: gen = %s", g, v)
		}
		sh(t, s, win, fmt.Sprintf("echo %d >> /root/gen.txt", g))
		if err := s.Client.MergeInto(ctx, root, win); err != nil {
			t.Fatalf("generation %d: merge: %v", g, err)
		}
		if err := s.Client.Delete(ctx, lose); err != nil {
			t.Fatalf("generation %d: delete loser: %v", g, err)
		}
	}
	t.Logf("%d fork(2)+merge+delete rounds in %s", rounds, time.Since(start))
	if v := value(t, s, root, "gen"); v != fmt.Sprint(rounds) {
		t.Fatalf("gen = %s", v)
	}
	r := sh(t, s, root, "wc -l < /root/gen.txt; tail -1 /root/gen.txt")
	if r.Stdout != fmt.Sprintf("%d\n%d\n", rounds+1, rounds) {
		t.Fatalf("gen.txt: %q", r.Stdout)
	}
	list, _ := s.Client.List(ctx, client.ListOptions{})
	if len(list) != 1 {
		t.Fatalf("%d sandboxes left", len(list))
	}
	// Nothing leaked on the host: one sandbox's processes in its family.
	if r := sh(t, s, root, "ps -e --no-headers | wc -l"); strings.TrimSpace(r.Stdout) == "" {
		t.Fatal("ps failed")
	} else {
		t.Logf("processes visible in the family after %d generations: %s", rounds, strings.TrimSpace(r.Stdout))
	}
}
