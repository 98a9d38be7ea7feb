// Package docs checks the documentation that is meant to stay true: every package says what it owns, and the
// README's examples (curl, CLI, Python SDK) run as written against a real server.
package docs

import (
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// Every package under internal/ (and the client) has a package doc comment saying what it owns.
func TestEveryPackageHasADocComment(t *testing.T) {
	roots := []string{"../../internal", "../../client", "../../cmd"}
	checked := 0
	for _, root := range roots {
		filepath.WalkDir(root, func(dir string, d os.DirEntry, err error) error {
			if err != nil || !d.IsDir() || strings.Contains(dir, "testdata") {
				return nil
			}
			pkgs, err := parser.ParseDir(token.NewFileSet(), dir, func(fi os.FileInfo) bool {
				return !strings.HasSuffix(fi.Name(), "_test.go")
			}, parser.ParseComments|parser.PackageClauseOnly)
			if err != nil {
				t.Errorf("%s: %v", dir, err)
				return nil
			}
			for name, p := range pkgs {
				checked++
				doc := ""
				for _, f := range p.Files {
					if f.Doc != nil {
						doc += f.Doc.Text()
					}
				}
				if len(strings.TrimSpace(doc)) < 40 {
					t.Errorf("package %s (%s) has no doc comment saying what it owns", name, dir)
				}
			}
			return nil
		})
	}
	if checked < 15 {
		t.Fatalf("checked only %d packages: is the walk broken?", checked)
	}
}

// docs/architecture.md's package map names every Go package of the repository.
func TestArchitectureMapsEveryPackage(t *testing.T) {
	arch, err := os.ReadFile("../../docs/architecture.md")
	if err != nil {
		t.Fatal(err)
	}
	for _, root := range []string{"internal", "client", "cmd", "tests"} {
		filepath.WalkDir(filepath.Join("../..", root), func(dir string, d os.DirEntry, err error) error {
			if err != nil || !d.IsDir() || strings.Contains(dir, "testdata") {
				return nil
			}
			files, _ := filepath.Glob(filepath.Join(dir, "*.go"))
			if len(files) == 0 {
				return nil
			}
			rel, _ := filepath.Rel("../..", dir)
			if !strings.Contains(string(arch), "`"+rel+"`") {
				t.Errorf("docs/architecture.md's package map does not list `%s`", rel)
			}
			return nil
		})
	}
}
