package sandbox

import (
	"errors"
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"strings"
	"testing"

	"github.com/ramify-dev/ramify/internal/errdefs"
	"github.com/ramify-dev/ramify/internal/store"
)

func TestCheckTable(t *testing.T) {
	cases := []struct {
		op  Op
		s   Status
		ok  bool
		msg string
	}{
		{OpUse, StatusRunning, true, ""},
		{OpUse, StatusPaused, false, "sandbox is not running"},
		{OpUse, StatusCreating, false, "sandbox is not running"},
		{OpPause, StatusPaused, false, "sandbox is not running"},
		{OpResume, StatusRunning, false, "sandbox is not paused or in error"},
		{OpResume, StatusError, true, ""},
		{OpFork, StatusPaused, true, ""},
		{OpFork, StatusError, false, "cannot fork a sandbox that is error"},
		{OpMerge, StatusPausing, false, "sandbox is not running"},
		{OpDiff, StatusPaused, false, "sandbox is not running"},
		{OpDestroy, StatusError, true, ""},
		{OpDestroy, StatusPausing, false, "cannot destroy a sandbox that is pausing"},
	}
	for _, c := range cases {
		err := check(c.op, c.s)
		if (err == nil) != c.ok {
			t.Errorf("check(%s, %s) = %v, want ok=%v", c.op, c.s, err, c.ok)
			continue
		}
		if err != nil {
			if !errors.Is(err, errdefs.ErrConflict) || errdefs.Message(err) != c.msg {
				t.Errorf("check(%s, %s) = %q, want conflict %q", c.op, c.s, errdefs.Message(err), c.msg)
			}
		}
	}
}

// TestTransitionTable: setStatus allows exactly these moves and refuses every other pair with a
// *TransitionError that is a conflict (409), leaving the status as it was.
func TestTransitionTable(t *testing.T) {
	legal := map[[2]Status]bool{
		{StatusCreating, StatusRunning}: true, {StatusCreating, StatusError}: true,
		{StatusWarm, StatusRunning}:    true,
		{StatusRunning, StatusPausing}: true, {StatusRunning, StatusError}: true,
		{StatusPausing, StatusPaused}: true, {StatusPausing, StatusRunning}: true, {StatusPausing, StatusError}: true,
		{StatusPaused, StatusResuming}:  true,
		{StatusResuming, StatusRunning}: true, {StatusResuming, StatusPaused}: true, {StatusResuming, StatusError}: true,
		{StatusError, StatusResuming}: true,
	}
	all := []Status{StatusCreating, StatusWarm, StatusRunning, StatusPausing, StatusPaused, StatusResuming, StatusError}
	s := &Service{}
	for _, from := range all {
		for _, to := range all {
			e := &entry{rec: store.Record{ID: "sbx_x", Status: string(from)}}
			waiting := s.changes(e)
			err := s.setStatus(e, to)
			if legal[[2]Status{from, to}] {
				if err != nil || Status(e.rec.Status) != to {
					t.Errorf("%s → %s refused: %v", from, to, err)
				}
				select {
				case <-waiting:
				default:
					t.Errorf("%s → %s did not wake the waiters", from, to)
				}
				continue
			}
			var te *TransitionError
			if !errors.As(err, &te) || !errors.Is(err, errdefs.ErrConflict) || te.From != from || te.To != to {
				t.Errorf("%s → %s = %v, want a conflict *TransitionError", from, to, err)
			}
			if Status(e.rec.Status) != from {
				t.Errorf("%s → %s refused but the status changed to %s", from, to, e.rec.Status)
			}
		}
	}
}

// TestStatusChangesGoThroughSetStatus: no code of the package writes an entry's status (x.rec.Status = ...)
// except setStatus, so the transition table sees every change. (Records being built or copied for saving are
// not entries' state.)
func TestStatusChangesGoThroughSetStatus(t *testing.T) {
	files, _ := filepath.Glob("*.go")
	fset := token.NewFileSet()
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range f.Decls {
			fn, ok := d.(*ast.FuncDecl)
			if !ok || fn.Name.Name == "setStatus" || fn.Body == nil {
				continue
			}
			ast.Inspect(fn.Body, func(n ast.Node) bool {
				as, ok := n.(*ast.AssignStmt)
				if !ok {
					return true
				}
				for _, lhs := range as.Lhs {
					if sel, ok := lhs.(*ast.SelectorExpr); ok && sel.Sel.Name == "Status" {
						if inner, ok := sel.X.(*ast.SelectorExpr); ok && inner.Sel.Name == "rec" {
							t.Errorf("%s: %s writes a status directly; use setStatus", fset.Position(as.Pos()), fn.Name.Name)
						}
					}
				}
				return true
			})
		}
	}
}
