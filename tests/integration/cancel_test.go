package integration

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/ramify-dev/ramify/client"
	"github.com/ramify-dev/ramify/internal/testserver"
)

// A client that goes away stops its work: an abandoned run_code is interrupted (the interpreter and its state
// live on, free for the next call) and an abandoned exec's processes are killed.
func TestAbandonedCallsStop(t *testing.T) {
	s := testserver.Start(t)
	id := create(t, s, nil)
	value(t, s, id, "x = 'kept'")

	ctx, cancel := context.WithTimeout(context.Background(), 1*time.Second)
	_, err := s.Client.RunCode(ctx, id, client.RunCodeRequest{Code: "import time; time.sleep(120)"})
	cancel()
	if err == nil {
		t.Fatal("the abandoned run_code returned without error")
	}
	start := time.Now()
	if v := value(t, s, id, "x"); v != "'kept'" {
		t.Errorf("the interpreter after an abandoned run_code: %s", v)
	}
	if waited := time.Since(start); waited > 30*time.Second {
		t.Errorf("the next run_code waited %v behind the abandoned one", waited)
	}

	ctx, cancel = context.WithTimeout(context.Background(), 1*time.Second)
	_, err = s.Client.Exec(ctx, id, client.ExecRequest{Cmd: "sleep 120; echo late"})
	cancel()
	if err == nil {
		t.Fatal("the abandoned exec returned without error")
	}
	deadline := time.Now().Add(20 * time.Second)
	for {
		out := strings.TrimSpace(sh(t, s, id, "pgrep -c -x sleep || true").Stdout)
		if out == "0" {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the abandoned exec's sleep still runs (%s)", out)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// A delete stops the calls in flight on its sandbox instead of waiting for them: code in an endless loop and a
// command that never ends (both without a timeout of their own, as an agent's runaway code is) answer 409 that
// the sandbox was deleted, the delete answers at once, and nothing is left. Before, the delete waited for them
// (the run_code's default timeout, 300 s; for ever for an exec without one).
func TestDeleteStopsCallsInFlight(t *testing.T) {
	s := testserver.Start(t, "--warm-pool", "0")
	ctx := ctxT(t)
	id := create(t, s, nil)
	errs := make(chan error, 2)
	go func() {
		_, err := s.Client.RunCode(ctx, id, client.RunCodeRequest{Code: "while True: pass"})
		errs <- err
	}()
	go func() {
		_, err := s.Client.Exec(ctx, id, client.ExecRequest{Cmd: "sleep 1000"})
		errs <- err
	}()
	time.Sleep(time.Second) // both running
	start := time.Now()
	if err := s.Client.Delete(ctx, id); err != nil {
		t.Fatalf("delete: %v", err)
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Errorf("the delete took %v with calls in flight", took)
	}
	for range 2 {
		select {
		case err := <-errs:
			if ae, ok := err.(*client.APIError); !ok || ae.StatusCode != 409 || !strings.Contains(ae.Message, "was deleted while the call ran") {
				t.Errorf("a call in flight during the delete: %v, want 409 saying the sandbox was deleted", err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("a call in flight did not answer after the delete")
		}
	}
	checkNoLeftovers(t, s, expect{})
}

// A delete stops the files transfers in flight on its sandbox: a download the client does not read and an upload
// that trickles (each holds the sandbox for as long as it runs, which a client can make for ever) end, the
// upload answering 409 that the sandbox was deleted, and the delete answers at once. Before, it waited as long
// as the client kept them going.
func TestDeleteStopsFileTransfers(t *testing.T) {
	s := testserver.Start(t, "--warm-pool", "0")
	ctx := ctxT(t)
	id := create(t, s, nil)
	if r := sh(t, s, id, "head -c 64000000 /dev/zero > /root/big && echo ok"); strings.TrimSpace(r.Stdout) != "ok" {
		t.Fatalf("write the file to download: %+v", r)
	}
	addr := strings.TrimPrefix(s.URL, "http://")
	dial := func() net.Conn {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		c.(*net.TCPConn).SetReadBuffer(4096)
		t.Cleanup(func() { c.Close() })
		return c
	}
	down := dial() // never read
	fmt.Fprintf(down, "GET /v1/sandboxes/%s/files?path=/root/big HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\n\r\n", id, s.Key)
	up := dial()
	fmt.Fprintf(up, "PUT /v1/sandboxes/%s/files?path=/root/up HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\nContent-Length: 100000000\r\n\r\n", id, s.Key)
	trickle := make(chan struct{})
	go func() { // a kilobyte every 100 ms: the body idle timeout never fires
		for {
			select {
			case <-trickle:
				return
			case <-time.After(100 * time.Millisecond):
				if _, err := up.Write(make([]byte, 1000)); err != nil {
					return
				}
			}
		}
	}()
	defer close(trickle)
	time.Sleep(1500 * time.Millisecond) // both under way
	start := time.Now()
	dctx, cancel := context.WithTimeout(ctx, 30*time.Second) // a hang fails here, not at the test's timeout
	defer cancel()
	if err := s.Client.Delete(dctx, id); err != nil {
		t.Fatalf("delete with files transfers in flight: %v after %v", err, time.Since(start))
	}
	if took := time.Since(start); took > 10*time.Second {
		t.Errorf("the delete took %v with files transfers in flight", took)
	}
	up.SetReadDeadline(time.Now().Add(10 * time.Second))
	resp, err := http.ReadResponse(bufio.NewReader(up), nil)
	if err != nil {
		t.Fatalf("the upload in flight got no answer: %v", err)
	}
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 409 || !strings.Contains(string(b), "was deleted while the call ran") {
		t.Errorf("the upload in flight: %d %s, want 409 saying the sandbox was deleted", resp.StatusCode, b)
	}
	checkNoLeftovers(t, s, expect{})
}

// A call to a sandbox whose agent is stopped (SIGSTOP from the host) ends at its timeout_s and a grace, with a
// 503 that says the agent did not answer, instead of waiting until the agent runs again; the sandbox is left as
// it is and answers once its agent runs.
func TestCallsToAStoppedAgentEndAfterTheirTimeout(t *testing.T) {
	s := testserver.Start(t, "--warm-pool", "0")
	ctx := ctxT(t)
	id := create(t, s, nil)
	value(t, s, id, "x = 1")
	cont := stopAgent(t, id)
	start := time.Now()
	errs := make(chan error, 2)
	go func() {
		_, err := s.Client.RunCode(ctx, id, client.RunCodeRequest{Code: "x", TimeoutS: client.Int(1)})
		errs <- err
	}()
	go func() {
		_, err := s.Client.Exec(ctx, id, client.ExecRequest{Cmd: "true", TimeoutS: client.Int(1)})
		errs <- err
	}()
	for range 2 {
		err := <-errs
		if ae, ok := err.(*client.APIError); !ok || ae.StatusCode != 503 || !strings.Contains(ae.Message, "did not answer") {
			t.Errorf("a call to a stopped agent: %v, want a 503 saying it did not answer", err)
		}
	}
	if took := time.Since(start); took > 40*time.Second {
		t.Errorf("the calls to a stopped agent took %v", took)
	}
	cont()
	if got := value(t, s, id, "x"); got != "1" {
		t.Fatalf("once its agent runs again: x = %s", got)
	}
}
