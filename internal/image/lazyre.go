package image

import (
	"regexp"
	"sync"
)

// lazyRegexp is a regular expression compiled on first use. The ramify binary is also every sandbox's agent and
// every family's init, which never build images: a package-level regexp.MustCompile would cost each of those
// processes the compiled forms (~170 KB of heap for this package's) and their compile time at start.
type lazyRegexp struct {
	expr string
	once sync.Once
	re   *regexp.Regexp
}

func lazyRE(expr string) *lazyRegexp { return &lazyRegexp{expr: expr} }

func (l *lazyRegexp) get() *regexp.Regexp {
	l.once.Do(func() { l.re = regexp.MustCompile(l.expr) })
	return l.re
}

func (l *lazyRegexp) MatchString(s string) bool { return l.get().MatchString(s) }

func (l *lazyRegexp) FindStringSubmatch(s string) []string { return l.get().FindStringSubmatch(s) }
