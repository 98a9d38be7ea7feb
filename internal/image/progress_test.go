package image

import (
	"bufio"
	"log/slog"
	"os"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestParseLine(t *testing.T) {
	tests := []struct {
		name  string
		prior []string // fed first, to set the parser's state
		line  string
		want  string // "" means the line is hidden
		step  bool
		last  bool
	}{
		// mmdebstrap --verbose (real lines)
		{name: "arch info hidden", line: "I: chroot architecture amd64 is equal to the host's architecture"},
		{name: "signed-by hidden", line: "I: finding correct signed-by value..."},
		{name: "setup hook hidden", line: `I: running --setup-hook in shell: sh -c 'mkdir -p "$1"/var/cache/apt/archives/' exec /tmp/mmcap/target`},
		{name: "apt update", line: "I: running apt-get update...", want: "updating package lists"},
		{name: "index Get hidden", line: "Get:1 http://deb.debian.org/debian bookworm InRelease [151 kB]"},
		{name: "Packages Get hidden", line: "Get:2 http://deb.debian.org/debian bookworm/main amd64 Packages [8790 kB]"},
		{name: "fetched hidden", line: "Fetched 8941 kB in 1s (7342 kB/s)"},
		{name: "reading lists hidden", line: "Reading package lists..."},
		{name: "essential download", line: "I: downloading packages with apt...", want: "downloading essential packages"},
		{name: "package list hidden", line: "  debconf gcc-12-base libacl1 libattr1 libaudit-common libaudit1 libblkid1"},
		{name: "total", line: "0 upgraded, 69 newly installed, 0 to remove and 0 not upgraded.", want: "69 packages to install"},
		{name: "need to get", line: "Need to get 29.7 MB of archives.", want: "downloading 29.7 MB"},
		{name: "need to get, partly cached", line: "Need to get 3072 kB/51.2 MB of archives.",
			want: "downloading 3072 kB (51.2 MB in all, the rest is cached)"},
		{name: "need to get, all cached", line: "Need to get 0 B/51.2 MB of archives.", want: "all 51.2 MB of packages are in the cache"},
		{name: "additional space hidden", line: "After this operation, 139 MB of additional disk space will be used."},
		{name: "first Get", prior: []string{"0 upgraded, 69 newly installed, 0 to remove and 0 not upgraded."},
			line: "Get:1 http://deb.debian.org/debian bookworm/main amd64 gcc-12-base amd64 12.2.0-14+deb12u1 [37.6 kB]",
			want: "downloading packages (1/69)", step: true},
		{name: "last Get", prior: []string{"0 upgraded, 2 newly installed, 0 to remove and 0 not upgraded.",
			"Get:1 http://deb.debian.org/debian bookworm/main amd64 gcc-12-base amd64 12.2.0-14+deb12u1 [37.6 kB]"},
			line: "Get:2 http://deb.debian.org/debian bookworm/main amd64 libc6 amd64 2.36-9+deb12u14 [2759 kB]",
			want: "downloading packages (2/2)", step: true, last: true},
		{name: "Get without total", line: "Get:7 http://deb.debian.org/debian bookworm/main amd64 debianutils amd64 5.7-0.5~deb12u1 [103 kB]",
			want: "downloading packages (1)", step: true},
		{name: "dpkg command hidden", line: "/usr/bin/dpkg --status-fd 8 --no-triggers --unpack --auto-deconfigure /tmp/mmcap/target/var/cache/apt/archives/gcc-12-base_12.2.0-14+deb12u1_amd64.deb "},
		{name: "extracting", line: "I: extracting archives...", want: "extracting essential packages"},
		{name: "installing essential", line: "I: installing essential packages...", want: "installing essential packages"},
		{name: "selecting hidden", line: "Selecting previously unselected package gcc-12-base:amd64."},
		{name: "preparing hidden", line: "Preparing to unpack .../gcc-12-base_12.2.0-14+deb12u1_amd64.deb ..."},
		{name: "unpacking", prior: []string{"0 upgraded, 96 newly installed, 0 to remove and 0 not upgraded."},
			line: "Unpacking gcc-12-base:amd64 (12.2.0-14+deb12u1) ...", want: "unpacking (1/96)", step: true},
		{name: "configuring", prior: []string{"0 upgraded, 96 newly installed, 0 to remove and 0 not upgraded.",
			"Unpacking gcc-12-base:amd64 (12.2.0-14+deb12u1) ..."},
			line: "Setting up python3-numpy (1:1.24.2-1+deb12u1) ...", want: "configuring python3-numpy (1/96)", step: true},
		{name: "new total resets counts", prior: []string{"0 upgraded, 1 newly installed, 0 to remove and 0 not upgraded.",
			"Setting up gcc-12-base:amd64 (12.2.0-14+deb12u1) ...", "0 upgraded, 5 newly installed, 0 to remove and 0 not upgraded."},
			line: "Setting up libc6:amd64 (2.36-9+deb12u14) ...", want: "configuring libc6 (1/5)", step: true},
		{name: "dpkg warning hidden", line: "dpkg: warning: ignoring pre-dependency problem!"},
		{name: "update-alternatives hidden", line: "update-alternatives: using /usr/bin/mawk to provide /usr/bin/awk (awk) in auto mode"},
		{name: "skip info hidden", line: "I: skipping essential/unlink as requested"},
		{name: "remaining", line: "I: installing remaining packages inside the chroot...", want: "installing the requested packages"},
		{name: "triggers hidden", line: "Processing triggers for libc-bin (2.36-9+deb12u14) ..."},
		{name: "sync-in", line: "I: running special hook: sync-in /var/cache/ramify/images/.cache/apt /var/cache/apt/archives/",
			want: "restoring cached packages"},
		{name: "sync-out", line: "I: running special hook: sync-out /var/cache/apt/archives /tmp/mmcap/cache2",
			want: "saving downloaded packages to the cache"},
		{name: "cleanup", line: "I: cleaning package lists and apt cache...", want: "cleaning up"},
		{name: "success hidden", line: "I: success in 75.7617 seconds"},
		{name: "error", line: "E: Unable to locate package python3-nosuchthing", want: "error: Unable to locate package python3-nosuchthing"},
		{name: "warning", line: "W: Some index files failed to download.", want: "warning: Some index files failed to download."},
		{name: "apt Err hidden", line: "Err:1 http://deb.debian.org/debian bookworm/main amd64 libc6 amd64 2.36-9+deb12u14"},
		// debootstrap (real lines)
		{name: "db arch hidden", line: "I: Target architecture can be executed"},
		{name: "db InRelease", line: "I: Retrieving InRelease ", want: "fetching release information"},
		{name: "db signature hidden", line: "I: Valid Release signature (key id 4D64FEC119C2029067D6E791F8D2585B8783D481)"},
		{name: "db Packages", line: "I: Retrieving Packages ", want: "fetching package lists"},
		{name: "db validating Packages hidden", line: "I: Validating Packages "},
		{name: "db resolving", line: "I: Resolving dependencies of required packages...", want: "resolving dependencies"},
		{name: "db resolving base hidden", line: "I: Resolving dependencies of base packages..."},
		{name: "db component hidden", line: "I: Checking component main on http://deb.debian.org/debian..."},
		{name: "db retrieving", line: "I: Retrieving libacl1 2.3.1-3", want: "downloading libacl1 (1)", step: true},
		{name: "db validating", line: "I: Validating bsdutils 1:2.38.1-5+deb12u3", want: "checking bsdutils (1)", step: true},
		{name: "db extractor hidden", line: "I: Chosen extractor for .deb packages: dpkg-deb"},
		{name: "db extracting", line: "I: Extracting adduser...", want: "extracting adduser (1)", step: true},
		{name: "db core", line: "I: Installing core packages...", want: "installing core packages"},
		{name: "db unpacking required", line: "I: Unpacking required packages...", want: "unpacking required packages"},
		{name: "db unpacking one", line: "I: Unpacking libacl1:amd64...", want: "unpacking libacl1 (1)", step: true},
		{name: "db configuring required", line: "I: Configuring required packages...", want: "configuring required packages"},
		{name: "db configuring one", line: "I: Configuring libldap-2.5-0:amd64...", want: "configuring libldap-2.5-0 (1)", step: true},
		{name: "db configuring no arch", line: "I: Configuring ca-certificates...", want: "configuring ca-certificates (1)", step: true},
		{name: "db base unpack", line: "I: Unpacking the base system...", want: "unpacking the base system"},
		{name: "db base configure", line: "I: Configuring the base system...", want: "configuring the base system"},
		{name: "db done", line: "I: Base system installed successfully.", want: "base system installed"},
		{name: "blank", line: "   "},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			p := newParser()
			for _, l := range tt.prior {
				p.parse(l)
			}
			ev, ok := p.parse(tt.line)
			if tt.want == "" {
				if ok {
					t.Fatalf("parse(%q) = %q, want hidden", tt.line, ev.msg)
				}
				return
			}
			if !ok || ev.msg != tt.want || ev.step != tt.step || ev.last != tt.last {
				t.Fatalf("parse(%q) = %+v, %v; want {msg:%q step:%v last:%v}", tt.line, ev, ok, tt.want, tt.step, tt.last)
			}
		})
	}
}

// replay feeds a captured log through a reporter whose clock never advances (so only the first and last
// per-package line of each series shows) and returns the progress lines.
func replay(t *testing.T, file string) []string {
	t.Helper()
	f, err := os.Open(file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out strings.Builder
	r := newReporter(&out, slog.New(slog.DiscardHandler))
	now := time.Unix(1000, 0)
	r.now = func() time.Time { return now }
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		r.raw(sc.Text())
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	if got := len(r.lastLines()); got != tailLines {
		t.Errorf("tail holds %d lines, want %d", got, tailLines)
	}
	return strings.Split(strings.TrimSuffix(out.String(), "\n"), "\n")
}

func TestReplayMmdebstrapLog(t *testing.T) {
	got := replay(t, "testdata/mmdebstrap-verbose.log")
	want := []string{
		"image: updating package lists",
		"image: downloading essential packages",
		"image: 69 packages to install",
		"image: downloading 29.7 MB",
		"image: downloading packages (1/69)",
		"image: downloading packages (69/69)",
		"image: extracting essential packages",
		"image: installing essential packages",
		"image: unpacking (69/69)",
		"image: configuring sysvinit-utils (69/69)",
		"image: installing the requested packages",
		"image: 96 packages to install",
		"image: downloading 51.2 MB",
		"image: downloading packages (96/96)",
		"image: unpacking (96/96)",
		"image: configuring python3-pandas (96/96)",
		"image: saving downloaded packages to the cache",
		"image: cleaning up",
	}
	if !slices.Equal(got, want) {
		t.Errorf("progress lines:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

func TestReplayDebootstrapLog(t *testing.T) {
	got := replay(t, "testdata/debootstrap.log")
	want := []string{
		"image: fetching release information",
		"image: fetching package lists",
		"image: resolving dependencies",
		"image: checking adduser (1)",
		"image: installing core packages",
		"image: unpacking required packages",
		"image: configuring required packages",
		"image: unpacking the base system",
		"image: configuring the base system",
		"image: base system installed",
	}
	if !slices.Equal(got, want) {
		t.Errorf("progress lines:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

func TestReporterThrottlesSteps(t *testing.T) {
	var out strings.Builder
	r := newReporter(&out, slog.New(slog.DiscardHandler))
	now := time.Unix(1000, 0)
	r.now = func() time.Time { return now }
	r.raw("0 upgraded, 4 newly installed, 0 to remove and 0 not upgraded.")
	for i, pkg := range []string{"a", "b", "c", "d"} {
		if i == 2 {
			now = now.Add(stepInterval)
		}
		r.raw("Setting up " + pkg + " (1.0) ...")
	}
	want := "image: 4 packages to install\nimage: configuring a (1/4)\nimage: configuring c (3/4)\nimage: configuring d (4/4)\n"
	if out.String() != want {
		t.Errorf("got:\n%swant:\n%s", out.String(), want)
	}
}

func TestSplitLines(t *testing.T) {
	long := strings.Repeat("x", maxLine+10)
	in := "a\nb\r\nc\rd" + "\n" + long + "\nend"
	sc := bufio.NewScanner(strings.NewReader(in))
	sc.Buffer(make([]byte, 1024), maxLine*2)
	sc.Split(splitLines)
	var got []string
	for sc.Scan() {
		got = append(got, sc.Text())
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	want := []string{"a", "b", "", "c", "d", long[:maxLine], "xxxxxxxxxx", "end"}
	if !slices.Equal(got, want) {
		t.Errorf("got %d lines %q..., want %d", len(got), got[:min(len(got), 5)], len(want))
	}
}
