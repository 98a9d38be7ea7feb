package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
)

// RunCode runs Python code in the sandbox's persistent interpreter and returns the result. A Python exception
// is not an error of the call: it is in Execution.Error.
func (c *Client) RunCode(ctx context.Context, id string, req RunCodeRequest) (*Execution, error) {
	var ex Execution
	if _, err := c.do(ctx, request{method: http.MethodPost, path: sandboxPath(id, "/run_code"), json: req}, &ex); err != nil {
		return nil, err
	}
	return &ex, nil
}

// RunCodeStream runs code like RunCode but streams its output: fn is called with each stdout / stderr event
// as it arrives (from the calling goroutine), and the final result is returned. fn may be nil.
func (c *Client) RunCodeStream(ctx context.Context, id string, req RunCodeRequest, fn func(Event)) (*Execution, error) {
	body := struct {
		RunCodeRequest
		Stream bool `json:"stream"`
	}{req, true}
	var ex Execution
	err := c.stream(ctx, sandboxPath(id, "/run_code"), body, "result", fn, &ex, func() {
		// A server that does not stream answered with the plain result: replay its output as events.
		replay(fn, ex.Stdout, ex.Stderr)
	})
	if err != nil {
		return nil, err
	}
	return &ex, nil
}

// Exec runs a command in the sandbox and returns its exit code and output. A non-zero exit code is not an
// error of the call.
func (c *Client) Exec(ctx context.Context, id string, req ExecRequest) (*ExecResult, error) {
	if err := checkExec(&req); err != nil {
		return nil, err
	}
	var res ExecResult
	if _, err := c.do(ctx, request{method: http.MethodPost, path: sandboxPath(id, "/exec"), json: req}, &res); err != nil {
		return nil, err
	}
	return &res, nil
}

// ExecStream runs a command like Exec but streams its output to fn (which may be nil) and returns the exit
// status. The returned ExecResult's Stdout and Stderr are empty.
func (c *Client) ExecStream(ctx context.Context, id string, req ExecRequest, fn func(Event)) (*ExecResult, error) {
	if err := checkExec(&req); err != nil {
		return nil, err
	}
	body := struct {
		ExecRequest
		Stream bool `json:"stream"`
	}{req, true}
	var res ExecResult
	err := c.stream(ctx, sandboxPath(id, "/exec"), body, "exit", fn, &res, func() {
		replay(fn, res.Stdout, res.Stderr)
		res.Stdout, res.Stderr = "", ""
	})
	if err != nil {
		return nil, err
	}
	return &res, nil
}

func checkExec(req *ExecRequest) error {
	if (req.Cmd == "") == (len(req.Argv) == 0) {
		return fmt.Errorf("exec: set exactly one of Cmd and Argv: %w", ErrInvalid)
	}
	return nil
}

func replay(fn func(Event), stdout, stderr string) {
	if fn == nil {
		return
	}
	if stdout != "" {
		fn(Event{Type: "stdout", Data: stdout})
	}
	if stderr != "" {
		fn(Event{Type: "stderr", Data: stderr})
	}
}

// stream posts body, reads the NDJSON answer, passes every event but the last to fn and decodes the final
// event (of type final) into out. If the server answered with one plain JSON result instead (no "type"
// field), it is decoded into out and plain is called.
func (c *Client) stream(ctx context.Context, path string, body any, final string, fn func(Event), out any, plain func()) error {
	resp, err := c.send(ctx, request{method: http.MethodPost, path: path, json: body, accept: "application/x-ndjson"})
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	dec := json.NewDecoder(resp.Body)
	for first := true; ; first = false {
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			if errors.Is(err, io.EOF) {
				return fmt.Errorf("POST %s: stream ended before its %q event: %w", path, final, io.ErrUnexpectedEOF)
			}
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return fmt.Errorf("POST %s: read stream: %w", path, err)
		}
		var ev struct {
			Type  string          `json:"type"`
			Data  json.RawMessage `json:"data"` // a string of output, or display_data's mime bundle
			Error any             `json:"error"`
		}
		if err := json.Unmarshal(raw, &ev); err != nil {
			return fmt.Errorf("POST %s: bad stream event %s: %w", path, raw, err)
		}
		if first && ev.Type == "" {
			// A server that does not stream answered with the plain result.
			if err := json.Unmarshal(raw, out); err != nil {
				return fmt.Errorf("POST %s: decode response: %w", path, err)
			}
			plain()
			return nil
		}
		switch ev.Type {
		case final:
			if err := json.Unmarshal(raw, out); err != nil {
				return fmt.Errorf("POST %s: bad %q event: %w", path, final, err)
			}
			return nil
		case "error":
			// A failure after the response started: the server can no longer change the status code.
			msg, _ := ev.Error.(string)
			if msg == "" {
				msg = string(raw)
			}
			return &APIError{StatusCode: http.StatusInternalServerError, Message: msg}
		default:
			if fn != nil {
				fn(streamEvent(ev.Type, ev.Data, raw))
			}
		}
	}
}

// What an Interrupt stops.
const (
	InterruptAll     = ""         // every run_code and exec call in flight
	InterruptRunCode = "run_code" // run_code calls only
	InterruptExec    = "exec"     // exec calls only
)

// Interrupt stops the sandbox's run_code and exec calls in flight (running, or queued for the interpreter): a
// run_code gets a KeyboardInterrupt, an exec's command and what it started are killed; each answers its own
// caller with Interrupted set. what is InterruptAll, InterruptRunCode or InterruptExec.
func (c *Client) Interrupt(ctx context.Context, id, what string) (Interrupted, error) {
	var out struct {
		Interrupted Interrupted `json:"interrupted"`
	}
	body := map[string]string{}
	if what != InterruptAll {
		body["what"] = what
	}
	if _, err := c.do(ctx, request{method: http.MethodPost, path: sandboxPath(id, "/interrupt"), json: body}, &out); err != nil {
		return Interrupted{}, err
	}
	return out.Interrupted, nil
}

// streamEvent makes the Event of one streamed line: output's data is a string, display_data's a mime bundle.
func streamEvent(typ string, data, raw json.RawMessage) Event {
	ev := Event{Type: typ, Raw: raw}
	if typ == "display_data" {
		r := Result{Type: typ}
		if json.Unmarshal(data, &r.Data) == nil {
			ev.Result = &r
		}
		return ev
	}
	json.Unmarshal(data, &ev.Data) //nolint:errcheck // an event of a kind this client does not know: Raw has it
	return ev
}
