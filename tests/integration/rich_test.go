package integration

import (
	"bytes"
	"encoding/json"
	"strings"
	"testing"

	"github.com/ramify-dev/ramify/client"
	"github.com/ramify-dev/ramify/internal/testserver"
)

var pngMagic = []byte("\x89PNG\r\n\x1a\n")

// richRun runs code, fails on an exception, and returns its results.
func richRun(t *testing.T, s *testserver.Server, id, code string) []client.Result {
	t.Helper()
	ex := run(t, s, id, code)
	if ex.Error != nil {
		t.Fatalf("run_code %q raised %s: %s\n%s", code, ex.Error.Name, ex.Error.Value, ex.Error.Traceback)
	}
	if ex.Results == nil {
		t.Fatalf("run_code %q: results is null", code)
	}
	return ex.Results
}

func kinds(rs []client.Result) string {
	var k []string
	for _, r := range rs {
		k = append(k, r.Type)
	}
	return strings.Join(k, ",")
}

func isPNG(r client.Result) bool { return bytes.HasPrefix(r.PNG(), pngMagic) }

// Rich results come back as a Jupyter kernel gives them: matplotlib figures (plt.show(), a trailing Figure, a
// figure left open), a DataFrame's HTML, display() of several objects in order, _repr_png_, and the size cap.
func TestRichResults(t *testing.T) {
	s := testserver.Start(t)
	id := create(t, s, nil)

	t.Run("PlainValue", func(t *testing.T) {
		rs := richRun(t, s, id, "x = 41\nx + 1")
		if kinds(rs) != "execute_result" || rs[0].Text() != "42" || len(rs[0].Data) != 1 {
			t.Fatalf("results %+v", rs)
		}
		if rs := richRun(t, s, id, "x = 1"); len(rs) != 0 {
			t.Fatalf("a cell without a value has results %+v", rs)
		}
	})
	t.Run("PltShow", func(t *testing.T) {
		rs := richRun(t, s, id, "import os, matplotlib.pyplot as plt\nassert os.environ['MPLBACKEND'] == 'Agg'\n"+
			"plt.plot([1, 3, 2])\nplt.show()\nprint(len(plt.get_fignums()))")
		if kinds(rs) != "display_data" || !isPNG(rs[0]) || !strings.Contains(rs[0].Text(), "Figure") {
			t.Fatalf("results %s %+v", kinds(rs), rs)
		}
	})
	t.Run("TrailingFigure", func(t *testing.T) {
		// The figure the cell returns is its execute_result, not shown a second time as an open figure.
		rs := richRun(t, s, id, "fig, ax = plt.subplots()\nax.bar(['a', 'b'], [3, 5])\nfig")
		if kinds(rs) != "execute_result" || !isPNG(rs[0]) {
			t.Fatalf("results %s %+v", kinds(rs), rs)
		}
		if v := value(t, s, id, "len(plt.get_fignums())"); v != "0" {
			t.Errorf("figures still open after the cell: %s", v)
		}
	})
	t.Run("FigureLeftOpen", func(t *testing.T) {
		rs := richRun(t, s, id, "plt.figure()\nplt.plot([1, 2])")
		if kinds(rs) != "execute_result,display_data" || !strings.Contains(rs[0].Text(), "Line2D") || !isPNG(rs[1]) {
			t.Fatalf("results %s %+v", kinds(rs), rs)
		}
	})
	t.Run("DataFrame", func(t *testing.T) {
		rs := richRun(t, s, id, "import pandas as pd\npd.DataFrame({'name': ['ada', 'bob'], 'n': [1, 2]})")
		if kinds(rs) != "execute_result" || !strings.Contains(rs[0].Text("text/html"), "<table") ||
			!strings.Contains(rs[0].Text(), "ada") {
			t.Fatalf("results %+v", rs)
		}
	})
	t.Run("DisplayInOrder", func(t *testing.T) {
		rs := richRun(t, s, id, "from IPython.display import display, HTML, Markdown, JSON\n"+
			"display(HTML('<i>a</i>'), Markdown('**b**'))\nprint('between')\ndisplay({'c': 3}, JSON({'d': [1]}))\n"+
			"import builtins\nbuiltins.display is display")
		if kinds(rs) != "display_data,display_data,display_data,display_data,execute_result" {
			t.Fatalf("results %s %+v", kinds(rs), rs)
		}
		var j any
		json.Unmarshal(rs[3].Data["application/json"], &j) //nolint:errcheck // compared below
		if rs[0].Text("text/html") != "<i>a</i>" || rs[1].Text("text/markdown") != "**b**" || rs[2].Text() != "{'c': 3}" ||
			!strings.Contains(string(rs[3].Data["application/json"]), `"d"`) || rs[4].Text() != "True" {
			t.Fatalf("results %+v (json %v)", rs, j)
		}
	})
	t.Run("DisplayHandle", func(t *testing.T) {
		// display_id gives a handle, as in Jupyter; its update() shows the new object as another display_data.
		rs := richRun(t, s, id, "from IPython.display import display\nh = display('v1', display_id=True)\nh.update('v2')")
		if kinds(rs) != "display_data,display_data" || rs[0].Text() != "'v1'" || rs[1].Text() != "'v2'" {
			t.Fatalf("results %s %+v", kinds(rs), rs)
		}
	})
	t.Run("ReprPNG", func(t *testing.T) {
		rs := richRun(t, s, id, "class Dot:\n    def _repr_png_(self):\n        return b'\\x89PNG\\r\\n\\x1a\\n-dot'\n"+
			"    def __repr__(self):\n        return 'Dot()'\nDot()")
		if kinds(rs) != "execute_result" || string(rs[0].PNG()) != "\x89PNG\r\n\x1a\n-dot" || rs[0].Text() != "Dot()" {
			t.Fatalf("results %+v", rs)
		}
	})
	t.Run("RawBundle", func(t *testing.T) {
		// IPython's display_png(data, raw=True) hands display() a bundle with bytes in it: they go out base64.
		rs := richRun(t, s, id, "from IPython.display import display_png\ndisplay_png(b'\\x89PNG\\r\\n\\x1a\\nraw', raw=True)")
		if kinds(rs) != "display_data" || string(rs[0].PNG()) != "\x89PNG\r\n\x1a\nraw" {
			t.Fatalf("results %+v", rs)
		}
	})
	t.Run("BrokenReprKeepsTheRest", func(t *testing.T) {
		ex := run(t, s, id, "class B:\n    def _repr_html_(self):\n        raise ValueError('no')\nB()")
		if ex.Error != nil || kinds(ex.Results) != "execute_result" || ex.Results[0].Data["text/html"] != nil ||
			!strings.Contains(ex.Stderr, "_repr_html_() failed: ValueError: no") {
			t.Fatalf("execution %+v", ex)
		}
	})
	t.Run("Streaming", func(t *testing.T) {
		var got strings.Builder // print() writes its text and its newline separately: output events are joined
		ex, err := s.Client.RunCodeStream(ctxT(t), id, client.RunCodeRequest{Code: "print('a')\ndisplay(1)\nprint('b')\n2"},
			func(ev client.Event) {
				if ev.Type == "display_data" && ev.Result != nil {
					got.WriteString("[display " + ev.Result.Text() + "]")
				} else {
					got.WriteString(ev.Data)
				}
			})
		if err != nil {
			t.Fatal(err)
		}
		if got := got.String(); got != "a\n[display 1]b\n" {
			t.Errorf("events %q", got)
		}
		if kinds(ex.Results) != "display_data,execute_result" || ex.Results[1].Text() != "2" {
			t.Errorf("results %+v", ex.Results)
		}
	})
	t.Run("SizeCap", func(t *testing.T) {
		// Three 7 MiB results: the third would take the cell past 16 MiB and is replaced by a note; the value stays.
		ex := run(t, s, id, "class Big:\n    def _repr_html_(self):\n        return 'x' * (7 << 20)\n"+
			"display(Big(), Big(), Big())\n'done'")
		if ex.Error != nil || kinds(ex.Results) != "display_data,display_data,display_data,execute_result" {
			t.Fatalf("error %+v results %s", ex.Error, kinds(ex.Results))
		}
		if len(ex.Results[0].Text("text/html")) != 7<<20 || len(ex.Results[1].Text("text/html")) != 7<<20 {
			t.Errorf("the first two results were cut")
		}
		if note := ex.Results[2].Text(); !strings.Contains(note, "left out") || !strings.Contains(note, "16 MiB") ||
			len(ex.Results[2].Data) != 1 {
			t.Errorf("third result %q", note)
		}
		if ex.Value == nil || *ex.Value != "'done'" || ex.Results[3].Text() != "'done'" {
			t.Errorf("value %v, last result %+v", ex.Value, ex.Results[3])
		}
		// The limit is per cell: the next one starts afresh.
		if rs := richRun(t, s, id, "display(Big())"); len(rs[0].Text("text/html")) != 7<<20 {
			t.Errorf("the next cell's result was cut")
		}
	})
}

// A session that imported display and pyplot pauses and resumes with them working: the replacements pickle by
// reference and are found again in the resumed interpreter.
func TestRichResultsAfterResume(t *testing.T) {
	s := testserver.Start(t)
	id := create(t, s, nil)
	richRun(t, s, id, "from IPython.display import display\nimport matplotlib.pyplot as plt\nshow = plt.show")
	if sb := pauseAndWait(t, s, id); len(sb.Pause.NotSaved) != 0 {
		t.Errorf("not saved: %+v", sb.Pause.NotSaved)
	}
	resumeAndWait(t, s, id)
	rs := richRun(t, s, id, "display('hi')\nplt.plot([1, 2])\nshow()")
	if kinds(rs) != "display_data,display_data" || rs[0].Text() != "'hi'" || !isPNG(rs[1]) {
		t.Fatalf("results %s %+v", kinds(rs), rs)
	}
}

// The default image has pip, and keeps apt's package lists so apt-get install works where the network allows.
func TestImageHasPipAndAptLists(t *testing.T) {
	s := testserver.Start(t)
	id := create(t, s, nil)
	if r := sh(t, s, id, "pip --version && apt-cache show --no-all-versions jq | grep -c '^Package: jq'"); r.ExitCode != 0 ||
		!strings.Contains(r.Stdout, "pip ") || !strings.HasSuffix(r.Stdout, "1\n") {
		t.Fatalf("exit %d stdout %q stderr %q", r.ExitCode, r.Stdout, r.Stderr)
	}
}
