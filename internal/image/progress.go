package image

import (
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"time"
)

// event is one human progress line derived from a raw line of the bootstrap tool's output.
type event struct {
	msg string
	// step marks per-package lines (downloading k/n, unpacking, configuring): there are hundreds of them, so
	// the reporter throttles them. Phase changes, warnings and errors are always shown.
	step bool
	// last marks the final step of a counted series (k == n), which is always shown.
	last bool
}

// parser turns mmdebstrap (run with --verbose, so apt's and dpkg's output is included) and debootstrap output
// into short human lines. It is stateful: it counts packages per phase.
type parser struct {
	total int            // packages apt announced for the current phase ("N newly installed"), 0 if unknown
	count map[string]int // per-kind counters, reset when apt announces a new phase
}

var (
	aptNewRE      = lazyRE(`^\d+ upgraded, (\d+) newly installed`)
	aptNeedRE     = lazyRE(`^Need to get (\S+ \S+?)(?:/(\S+ \S+))? of archives`)
	aptGetRE      = lazyRE(`^Get:(\d+) \S+ \S+ \S+ (\S+) \S+ \S+ \[`)
	dpkgUnpackRE  = lazyRE(`^Unpacking (\S+) \(`)
	dpkgSetupRE   = lazyRE(`^Setting up (\S+) \(`)
	dbRetrieveRE  = lazyRE(`^I: Retrieving (\S+) \S+`)
	dbValidateRE  = lazyRE(`^I: Validating (\S+) \S+`)
	dbExtractRE   = lazyRE(`^I: Extracting (\S+)\.\.\.$`)
	dbUnpackRE    = lazyRE(`^I: Unpacking (\S+)\.\.\.$`)
	dbConfigureRE = lazyRE(`^I: Configuring (\S+)\.\.\.$`)
	pipCollectRE  = lazyRE(`^Collecting (\S+)`)
	pipDoneRE     = lazyRE(`^Successfully installed (.+)$`)
)

// phases maps informational lines of mmdebstrap and debootstrap to what we show (an empty value hides the line).
var phases = map[string]string{
	// mmdebstrap
	"I: running apt-get update...":                          "updating package lists",
	"I: downloading packages with apt...":                   "downloading essential packages",
	"I: extracting archives...":                             "extracting essential packages",
	"I: installing essential packages...":                   "installing essential packages",
	"I: installing remaining packages inside the chroot...": "installing the requested packages",
	"I: cleaning package lists and apt cache...":            "cleaning up",
	// debootstrap
	"I: Retrieving InRelease":                           "fetching release information",
	"I: Retrieving Release":                             "fetching release information",
	"I: Retrieving Packages":                            "fetching package lists",
	"I: Resolving dependencies of required packages...": "resolving dependencies",
	"I: Resolving dependencies of base packages...":     "",
	"I: Installing core packages...":                    "installing core packages",
	"I: Unpacking required packages...":                 "unpacking required packages",
	"I: Configuring required packages...":               "configuring required packages",
	"I: Unpacking the base system...":                   "unpacking the base system",
	"I: Configuring the base system...":                 "configuring the base system",
	"I: Base system installed successfully.":            "base system installed",
}

func newParser() *parser { return &parser{count: map[string]int{}} }

// step counts one more item of kind and formats "what (k/n)" or "what (k)" when the total is unknown.
func (p *parser) step(kind, what string) (event, bool) {
	p.count[kind]++
	k := p.count[kind]
	if p.total > 0 {
		if k > p.total {
			k = p.total
		}
		return event{msg: fmt.Sprintf("%s (%d/%d)", what, k, p.total), step: true, last: k == p.total}, true
	}
	return event{msg: fmt.Sprintf("%s (%d)", what, k), step: true}, true
}

// parse returns the human line for one raw output line, or false when the line is not worth showing.
func (p *parser) parse(line string) (event, bool) {
	line = strings.TrimRight(line, " \t\r")
	if line == "" {
		return event{}, false
	}
	if msg, ok := phases[line]; ok {
		if msg == "" {
			return event{}, false
		}
		return event{msg: msg}, true
	}
	switch {
	case strings.HasPrefix(line, "E: "):
		return event{msg: "error: " + line[3:]}, true
	case strings.HasPrefix(line, "W: "):
		return event{msg: "warning: " + line[3:]}, true
	case strings.HasPrefix(line, "I: running special hook: sync-in "):
		return event{msg: "restoring cached packages"}, true
	case strings.HasPrefix(line, "I: running special hook: sync-out "):
		return event{msg: "saving downloaded packages to the cache"}, true
	}
	// apt
	if m := aptNewRE.FindStringSubmatch(line); m != nil {
		n, _ := strconv.Atoi(m[1])
		p.total = n
		clear(p.count)
		return event{msg: fmt.Sprintf("%d packages to install", n)}, true
	}
	if m := aptNeedRE.FindStringSubmatch(line); m != nil {
		// "Need to get 51.2 MB of archives." or, with some of them cached, "Need to get 3 MB/51.2 MB of archives."
		if m[2] != "" && (m[1] == "0 B") {
			return event{msg: fmt.Sprintf("all %s of packages are in the cache", m[2])}, true
		}
		if m[2] != "" {
			return event{msg: fmt.Sprintf("downloading %s (%s in all, the rest is cached)", m[1], m[2])}, true
		}
		return event{msg: "downloading " + m[1]}, true
	}
	if m := aptGetRE.FindStringSubmatch(line); m != nil {
		return p.step("get", "downloading packages")
	}
	if m := dpkgUnpackRE.FindStringSubmatch(line); m != nil {
		return p.step("unpack", "unpacking")
	}
	if m := dpkgSetupRE.FindStringSubmatch(line); m != nil {
		return p.step("setup", "configuring "+pkgBase(m[1]))
	}
	// debootstrap (its per-package lines carry no totals)
	if m := dbRetrieveRE.FindStringSubmatch(line); m != nil {
		return p.step("get", "downloading "+m[1])
	}
	if m := dbValidateRE.FindStringSubmatch(line); m != nil {
		return p.step("validate", "checking "+m[1])
	}
	if m := dbExtractRE.FindStringSubmatch(line); m != nil {
		return p.step("extract", "extracting "+m[1])
	}
	if m := dbUnpackRE.FindStringSubmatch(line); m != nil {
		return p.step("unpack", "unpacking "+pkgBase(m[1]))
	}
	if m := dbConfigureRE.FindStringSubmatch(line); m != nil {
		return p.step("setup", "configuring "+pkgBase(m[1]))
	}
	// pip
	if m := pipCollectRE.FindStringSubmatch(line); m != nil {
		return event{msg: "pip: collecting " + m[1]}, true
	}
	if m := pipDoneRE.FindStringSubmatch(line); m != nil {
		return event{msg: "pip: installed " + m[1]}, true
	}
	return event{}, false
}

// pkgBase drops dpkg's ":amd64" architecture qualifier.
func pkgBase(s string) string {
	if i := strings.IndexByte(s, ':'); i > 0 {
		return s[:i]
	}
	return s
}

// stepInterval is the minimum time between two shown per-package lines.
const stepInterval = 2 * time.Second

// tailLines is how many raw output lines a build error quotes.
const tailLines = 20

// reporter writes "image: ..." progress lines to w, logs every raw line at debug level and remembers the last
// raw lines for error messages. It is safe for concurrent use.
type reporter struct {
	mu       sync.Mutex
	w        io.Writer
	log      *slog.Logger
	p        *parser
	now      func() time.Time
	lastStep time.Time
	lastMsg  string
	tail     []string
	source   string // tool name, for the log
}

func newReporter(w io.Writer, log *slog.Logger) *reporter {
	return &reporter{w: w, log: log, p: newParser(), now: time.Now}
}

// say writes one progress line.
func (r *reporter) say(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	fmt.Fprintf(r.w, "image: "+format+"\n", args...)
}

// raw handles one raw line of tool output.
func (r *reporter) raw(line string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.log.Debug("image build output", "tool", r.source, "line", line)
	if len(r.tail) == tailLines {
		copy(r.tail, r.tail[1:])
		r.tail = r.tail[:tailLines-1]
	}
	r.tail = append(r.tail, line)
	ev, ok := r.p.parse(line)
	if !ok {
		return
	}
	if ev.msg == r.lastMsg { // apt repeats some lines (mmdebstrap runs it twice in the chroot)
		return
	}
	if ev.step {
		now := r.now()
		if !ev.last && now.Sub(r.lastStep) < stepInterval {
			return
		}
		r.lastStep = now
	}
	r.lastMsg = ev.msg
	fmt.Fprintf(r.w, "image: %s\n", ev.msg)
}

// lastLines returns the remembered raw lines, oldest first.
func (r *reporter) lastLines() []string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]string(nil), r.tail...)
}

// resetTail forgets the remembered raw lines (between two commands).
func (r *reporter) resetTail(source string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.tail = r.tail[:0]
	r.source = source
}
