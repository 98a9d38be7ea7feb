package api

import (
	"encoding/json"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/ramify-dev/ramify/internal/errdefs"
	"github.com/ramify-dev/ramify/internal/sandbox"
)

func (s *Server) create(w http.ResponseWriter, r *http.Request) {
	var req sandbox.CreateRequest
	if err := decode(w, r, &req, true); err != nil {
		writeError(w, err)
		return
	}
	info, err := s.svc.Create(r.Context(), req)
	if err != nil {
		writeError(w, err)
		return
	}
	if req.Cwd != "" {
		// A cwd missing from the sandbox's file system would only show later, as every exec failing with a
		// misleading "fork/exec /bin/sh": refuse the sandbox now.
		if err := s.checkCwd(r, info.ID, info.Cwd); err != nil {
			if derr := s.svc.Delete(r.Context(), info.ID); derr != nil {
				s.log.Warn("create: could not remove the sandbox made with a missing cwd", "id", info.ID, "err", derr)
			}
			writeError(w, err)
			return
		}
	}
	writeJSON(w, http.StatusCreated, info)
}

func (s *Server) list(w http.ResponseWriter, r *http.Request) {
	o := sandbox.ListOptions{Status: sandbox.Status(r.URL.Query().Get("status")), Metadata: map[string]string{}}
	if o.Status != "" {
		if err := sandbox.ValidStatus(o.Status); err != nil {
			writeError(w, err)
			return
		}
	}
	for k, v := range r.URL.Query() {
		if mk, ok := metadataKey(k); ok && len(v) > 0 {
			o.Metadata[mk] = v[0]
		}
	}
	writeJSON(w, 200, map[string]any{"sandboxes": s.svc.List(r.Context(), o)})
}

// metadataKey returns the metadata key a list filter names: metadata[<key>] (OpenAPI's deepObject style, what
// generated clients send) or metadata.<key>.
func metadataKey(param string) (string, bool) {
	if k, ok := strings.CutPrefix(param, "metadata["); ok && strings.HasSuffix(k, "]") {
		return k[:len(k)-1], true
	}
	return strings.CutPrefix(param, "metadata.")
}

func (s *Server) get(w http.ResponseWriter, r *http.Request) {
	info, err := s.svc.Get(r.Context(), r.PathValue("id"))
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, 200, info)
}

// maxWait bounds a wait request; a client that wants to wait longer asks again.
const maxWait = 60 * time.Second

// wait answers GET /v1/sandboxes/{id}/wait?status=paused&timeout_s=20 as soon as the sandbox has that status (or
// "error"), or when the timeout (default 20 s, at most 60 s: more is 400) passes, with the sandbox as GET shows it then.
func (s *Server) wait(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	want := sandbox.Status(q.Get("status"))
	if want == "" {
		writeError(w, errdefs.New(errdefs.ErrInvalid, "status is required, e.g. ?status=paused"))
		return
	}
	timeout := 20 * time.Second
	if v := q.Get("timeout_s"); v != "" {
		f, err := strconv.ParseFloat(v, 64)
		if err != nil || f < 0 || f > maxWait.Seconds() || f != f {
			writeError(w, errdefs.New(errdefs.ErrInvalid, "timeout_s must be a number of seconds between 0 and 60"))
			return
		}
		timeout = time.Duration(f * float64(time.Second))
	}
	info, err := s.svc.Wait(r.Context(), r.PathValue("id"), want, timeout)
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, 200, info)
}

func (s *Server) delete(w http.ResponseWriter, r *http.Request) {
	if err := s.svc.Delete(r.Context(), r.PathValue("id")); err != nil {
		writeError(w, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// wantsStream reports whether the client asked for NDJSON.
func wantsStream(r *http.Request, flag bool) bool {
	return flag || strings.Contains(r.Header.Get("Accept"), "application/x-ndjson")
}

// ndjson writes events as they come, flushing each.
type ndjson struct {
	mu      sync.Mutex
	w       http.ResponseWriter
	enc     *json.Encoder
	started bool
}

func newNDJSON(w http.ResponseWriter) *ndjson {
	return &ndjson{w: w, enc: json.NewEncoder(w)}
}

func (n *ndjson) start() {
	if !n.started {
		n.started = true
		n.w.Header().Set("Content-Type", "application/x-ndjson")
		n.w.Header().Set("X-Content-Type-Options", "nosniff")
		n.w.WriteHeader(200)
	}
}

func (n *ndjson) send(v any) {
	n.mu.Lock()
	defer n.mu.Unlock()
	n.start()
	n.enc.Encode(v) //nolint:errcheck // the client went away; the call's context ends the work
	http.NewResponseController(n.w).Flush()
}

// finish sends the terminal event, or an error: as a JSON error response if nothing was streamed yet, else as
// an {"type":"error"} event.
func (n *ndjson) finish(result any, err error) {
	n.mu.Lock()
	started := n.started
	n.mu.Unlock()
	if err != nil {
		if !started {
			writeError(n.w, err)
			return
		}
		n.send(map[string]string{"type": "error", "error": err.Error()})
		return
	}
	n.send(result)
}

// runCodeBody is run_code's body: code is a pointer so that a missing or null code is told apart from "" (400).
type runCodeBody struct {
	sandbox.RunCodeRequest
	Code *string `json:"code"` // shadows RunCodeRequest.Code when decoding
}

func (s *Server) runCode(w http.ResponseWriter, r *http.Request) {
	var body runCodeBody
	if err := decode(w, r, &body, false); err != nil {
		writeError(w, err)
		return
	}
	if body.Code == nil {
		writeError(w, errdefs.New(errdefs.ErrInvalid, `code is required: a string of Python, e.g. {"code": "1 + 1"}`))
		return
	}
	req := body.RunCodeRequest
	req.Code = *body.Code
	id := r.PathValue("id")
	if !wantsStream(r, req.Stream) {
		res, err := s.svc.RunCode(r.Context(), id, req, nil)
		if err != nil {
			writeError(w, err)
			return
		}
		writeJSON(w, 200, res)
		return
	}
	n := newNDJSON(w)
	res, err := s.svc.RunCode(r.Context(), id, req, func(ev sandbox.OutputEvent) { n.send(ev) })
	n.finish(struct {
		Type string `json:"type"`
		sandbox.Execution
	}{"result", res}, err)
}

// checkExec refuses what the kernel cannot pass to a process: NUL bytes in the command, its arguments or cwd
// (execve would truncate them, or fail with a misleading exit 126).
func checkExec(req sandbox.ExecRequest) error {
	if strings.IndexByte(req.Cmd, 0) >= 0 {
		return errdefs.New(errdefs.ErrInvalid, "cmd must not contain NUL bytes")
	}
	for _, a := range req.Argv {
		if strings.IndexByte(a, 0) >= 0 {
			return errdefs.New(errdefs.ErrInvalid, "argv must not contain NUL bytes")
		}
	}
	if strings.IndexByte(req.Cwd, 0) >= 0 {
		return errdefs.New(errdefs.ErrInvalid, "cwd must not contain NUL bytes")
	}
	return nil
}

// checkCwd answers 400 unless cwd is a directory in sandbox id's file system (symlinks followed inside it).
func (s *Server) checkCwd(r *http.Request, id, cwd string) error {
	fc, err := s.svc.Files(r.Context(), id)
	if err != nil {
		return err
	}
	defer fc.Release()
	if err := fc.CheckDir(cwd); err != nil {
		if errors.Is(err, errdefs.ErrNotFound) || errors.Is(err, errdefs.ErrInvalid) {
			return errdefs.New(errdefs.ErrInvalid, "cwd "+cwd+" is not a directory in the sandbox")
		}
		return err
	}
	return nil
}

func (s *Server) exec(w http.ResponseWriter, r *http.Request) {
	var req sandbox.ExecRequest
	if err := decode(w, r, &req, false); err != nil {
		writeError(w, err)
		return
	}
	if err := checkExec(req); err != nil {
		writeError(w, err)
		return
	}
	id := r.PathValue("id")
	if req.Cwd != "" && req.Cwd[0] == '/' {
		if err := s.checkCwd(r, id, req.Cwd); err != nil {
			writeError(w, err)
			return
		}
	}
	if !wantsStream(r, req.Stream) {
		res, err := s.svc.Exec(r.Context(), id, req, nil)
		if err != nil {
			writeError(w, err)
			return
		}
		writeJSON(w, 200, res)
		return
	}
	n := newNDJSON(w)
	res, err := s.svc.Exec(r.Context(), id, req, func(ev sandbox.OutputEvent) { n.send(ev) })
	n.finish(struct {
		Type string `json:"type"`
		sandbox.ExecResult
	}{"exit", res}, err)
}

// interrupt stops the sandbox's run_code and exec calls in flight: body {"what": "run_code"|"exec"}, optional
// (both by default); it answers {"interrupted": {"run_code": n, "exec": m}}.
func (s *Server) interrupt(w http.ResponseWriter, r *http.Request) {
	var req struct {
		What string `json:"what"`
	}
	if err := decode(w, r, &req, true); err != nil {
		writeError(w, err)
		return
	}
	n, err := s.svc.Interrupt(r.Context(), r.PathValue("id"), req.What)
	if err != nil {
		writeError(w, err)
		return
	}
	writeJSON(w, 200, map[string]any{"interrupted": n})
}
