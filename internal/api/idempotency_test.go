package api

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// idemCase sends POSTs through an idemStore to a handler that counts its runs.
type idemCase struct {
	t     *testing.T
	st    *idemStore
	runs  atomic.Int32
	h     http.HandlerFunc
	clock time.Time
}

func newIdemCase(t *testing.T, h func(n int32, w http.ResponseWriter, r *http.Request)) *idemCase {
	c := &idemCase{t: t, st: newIdemStore(), clock: time.Unix(1_700_000_000, 0)}
	c.st.now = func() time.Time { return c.clock }
	c.h = func(w http.ResponseWriter, r *http.Request) { h(c.runs.Add(1), w, r) }
	return c
}

func (c *idemCase) post(ctx context.Context, path, key, body string) *httptest.ResponseRecorder {
	r := httptest.NewRequestWithContext(ctx, "POST", path, strings.NewReader(body))
	if key != "" {
		r.Header.Set(IdempotencyKeyHeader, key)
	}
	w := httptest.NewRecorder()
	k, ok := idemKeyOf(r)
	if !ok {
		c.h(w, r)
		return w
	}
	c.st.serve(w, r, k, c.h)
	return w
}

func forkLike(n int32, w http.ResponseWriter, r *http.Request) {
	b, _ := io.ReadAll(r.Body)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Run", fmt.Sprint(n))
	w.WriteHeader(http.StatusCreated)
	fmt.Fprintf(w, `{"run":%d,"body":%q}`, n, b)
}

func TestIdempotencyReplaysTheFirstAnswer(t *testing.T) {
	c := newIdemCase(t, forkLike)
	first := c.post(context.Background(), "/v1/sandboxes/a/fork", "k1", `{"n":5}`)
	again := c.post(context.Background(), "/v1/sandboxes/a/fork", "k1", `{"n":5}`)
	if c.runs.Load() != 1 {
		t.Fatalf("the handler ran %d times for one key", c.runs.Load())
	}
	if first.Code != 201 || again.Code != 201 || again.Body.String() != first.Body.String() {
		t.Fatalf("repeat: %d %q, first %d %q", again.Code, again.Body, first.Code, first.Body)
	}
	if again.Header().Get("X-Run") != "1" || again.Header().Get("Content-Type") != "application/json" {
		t.Errorf("repeat's headers are not the first answer's: %v", again.Header())
	}
	if again.Header().Get("Idempotent-Replayed") != "true" || first.Header().Get("Idempotent-Replayed") != "" {
		t.Errorf("Idempotent-Replayed: first %q, repeat %q", first.Header().Get("Idempotent-Replayed"), again.Header().Get("Idempotent-Replayed"))
	}
	// Without a key, or with another key, every call runs.
	c.post(context.Background(), "/v1/sandboxes/a/fork", "", `{"n":5}`)
	c.post(context.Background(), "/v1/sandboxes/a/fork", "k2", `{"n":5}`)
	if c.runs.Load() != 3 {
		t.Errorf("calls without the key: %d runs, want 3", c.runs.Load())
	}
}

func TestIdempotencyKeyReusedForAnotherRequest(t *testing.T) {
	c := newIdemCase(t, forkLike)
	c.post(context.Background(), "/v1/sandboxes/a/fork", "k", `{"n":5}`)
	for _, tc := range []struct{ path, body string }{
		{"/v1/sandboxes/a/fork", `{"n":6}`},
		{"/v1/sandboxes/b/fork", `{"n":5}`},
		{"/v1/sandboxes/a/fork?x=1", `{"n":5}`},
	} {
		w := c.post(context.Background(), tc.path, "k", tc.body)
		if w.Code != http.StatusUnprocessableEntity || !strings.Contains(w.Body.String(), `"error":"idempotency key reused`) {
			t.Errorf("%s %s: %d %s, want 422", tc.path, tc.body, w.Code, w.Body)
		}
	}
	if c.runs.Load() != 1 {
		t.Errorf("%d runs, want 1", c.runs.Load())
	}
}

func TestIdempotencyRepeatWaitsForTheFirstCall(t *testing.T) {
	release := make(chan struct{})
	started := make(chan struct{}, 1)
	c := newIdemCase(t, func(n int32, w http.ResponseWriter, r *http.Request) {
		started <- struct{}{}
		<-release
		forkLike(n, w, r)
	})
	var wg sync.WaitGroup
	answers := make([]*httptest.ResponseRecorder, 3)
	wg.Add(1)
	go func() { defer wg.Done(); answers[0] = c.post(context.Background(), "/p", "k", "x") }()
	<-started
	for i := 1; i < 3; i++ {
		wg.Add(1)
		go func() { defer wg.Done(); answers[i] = c.post(context.Background(), "/p", "k", "x") }()
	}
	// A repeat whose client leaves while it waits gets nothing and changes nothing.
	ctx, cancel := context.WithCancel(context.Background())
	gone := make(chan struct{})
	go func() { defer close(gone); c.post(ctx, "/p", "k", "x") }()
	time.Sleep(50 * time.Millisecond)
	cancel()
	<-gone
	close(release)
	wg.Wait()
	for i, a := range answers {
		if a.Code != 201 || a.Body.String() != answers[0].Body.String() {
			t.Errorf("call %d: %d %s", i, a.Code, a.Body)
		}
	}
	if c.runs.Load() != 1 {
		t.Errorf("%d runs, want 1", c.runs.Load())
	}
}

func TestIdempotencyForgetsWhatARepeatMustRedo(t *testing.T) {
	t.Run("5xx", func(t *testing.T) {
		c := newIdemCase(t, func(n int32, w http.ResponseWriter, r *http.Request) {
			if n == 1 {
				writeJSON(w, 500, map[string]string{"error": "boom"})
				return
			}
			forkLike(n, w, r)
		})
		if w := c.post(context.Background(), "/p", "k", "x"); w.Code != 500 {
			t.Fatalf("first: %d", w.Code)
		}
		if w := c.post(context.Background(), "/p", "k", "x"); w.Code != 201 || c.runs.Load() != 2 {
			t.Fatalf("repeat after a 500: %d, %d runs (want 201, 2)", w.Code, c.runs.Load())
		}
		if w := c.post(context.Background(), "/p", "k", "x"); w.Code != 201 || c.runs.Load() != 2 || w.Header().Get("Idempotent-Replayed") != "true" {
			t.Fatalf("third: %d, %d runs", w.Code, c.runs.Load())
		}
	})
	t.Run("error after the client left", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		c := newIdemCase(t, func(n int32, w http.ResponseWriter, r *http.Request) {
			if n == 1 {
				cancel()
				writeJSON(w, 409, map[string]string{"error": "fork: context canceled"})
				return
			}
			forkLike(n, w, r)
		})
		c.post(ctx, "/p", "k", "x")
		if w := c.post(context.Background(), "/p", "k", "x"); w.Code != 201 || c.runs.Load() != 2 {
			t.Fatalf("repeat: %d, %d runs (want 201, 2)", w.Code, c.runs.Load())
		}
	})
	t.Run("success after the client left is kept", func(t *testing.T) {
		ctx, cancel := context.WithCancel(context.Background())
		c := newIdemCase(t, func(n int32, w http.ResponseWriter, r *http.Request) {
			cancel()
			forkLike(n, w, r)
		})
		c.post(ctx, "/p", "k", "x")
		if w := c.post(context.Background(), "/p", "k", "x"); w.Code != 201 || c.runs.Load() != 1 {
			t.Fatalf("repeat: %d, %d runs (want the first answer, 1 run)", w.Code, c.runs.Load())
		}
	})
	t.Run("4xx with the client there is kept", func(t *testing.T) {
		c := newIdemCase(t, func(n int32, w http.ResponseWriter, r *http.Request) {
			writeJSON(w, 409, map[string]string{"error": fmt.Sprint("busy ", n)})
		})
		c.post(context.Background(), "/p", "k", "x")
		if w := c.post(context.Background(), "/p", "k", "x"); w.Code != 409 || !strings.Contains(w.Body.String(), "busy 1") {
			t.Fatalf("repeat: %d %s", w.Code, w.Body)
		}
	})
	t.Run("panic", func(t *testing.T) {
		c := newIdemCase(t, func(n int32, w http.ResponseWriter, r *http.Request) {
			if n == 1 {
				panic(http.ErrAbortHandler)
			}
			forkLike(n, w, r)
		})
		func() {
			defer func() { recover() }() //nolint:errcheck // net/http recovers it
			c.post(context.Background(), "/p", "k", "x")
		}()
		if w := c.post(context.Background(), "/p", "k", "x"); w.Code != 201 || c.runs.Load() != 2 {
			t.Fatalf("repeat after a panic: %d, %d runs", w.Code, c.runs.Load())
		}
	})
}

func TestIdempotencyUnreplayableAnswers(t *testing.T) {
	for name, h := range map[string]func(int32, http.ResponseWriter, *http.Request){
		"streamed": func(n int32, w http.ResponseWriter, r *http.Request) {
			w.Write([]byte("{}\n")) //nolint:errcheck
			w.(http.Flusher).Flush()
		},
		"too large": func(n int32, w http.ResponseWriter, r *http.Request) {
			w.Write([]byte(strings.Repeat("x", 2000))) //nolint:errcheck
		},
	} {
		t.Run(name, func(t *testing.T) {
			c := newIdemCase(t, h)
			c.st.maxBody = 1000
			if w := c.post(context.Background(), "/p", "k", "x"); w.Code != 200 {
				t.Fatalf("first: %d", w.Code)
			}
			w := c.post(context.Background(), "/p", "k", "x")
			if w.Code != 409 || !strings.Contains(w.Body.String(), "cannot be replayed") || c.runs.Load() != 1 {
				t.Fatalf("repeat: %d %s, %d runs", w.Code, w.Body, c.runs.Load())
			}
		})
	}
}

func TestIdempotencyKeysExpireAndAreBounded(t *testing.T) {
	c := newIdemCase(t, forkLike)
	c.post(context.Background(), "/p", "old", "x")
	c.clock = c.clock.Add(idemTTL + time.Second)
	c.post(context.Background(), "/p", "old", "x")
	if c.runs.Load() != 2 {
		t.Fatalf("a key past its ttl: %d runs, want 2", c.runs.Load())
	}
	c.st.maxKeys = 3
	for i := range 5 {
		c.post(context.Background(), "/p", fmt.Sprint("k", i), "x")
	}
	if len(c.st.calls) != 3 || len(c.st.order) != 3 {
		t.Fatalf("%d keys kept (%d in order), want 3", len(c.st.calls), len(c.st.order))
	}
	before := c.runs.Load()
	c.post(context.Background(), "/p", "k4", "x") // kept: replayed
	c.post(context.Background(), "/p", "k0", "x") // evicted: runs again
	if got := c.runs.Load() - before; got != 1 {
		t.Errorf("%d runs for a kept and an evicted key, want 1", got)
	}
	c.st.maxKeys, c.st.maxBytes = 100, 0
	c.post(context.Background(), "/p", "big", "x")
	if c.st.bytes != 0 || len(c.st.calls) != 0 {
		t.Errorf("over the byte bound: %d bytes, %d keys kept", c.st.bytes, len(c.st.calls))
	}
}

func TestIdempotencyKeyValidation(t *testing.T) {
	c := newIdemCase(t, forkLike)
	for _, k := range []string{strings.Repeat("a", 256), "a b", "ключ", "\x01"} {
		if w := c.post(context.Background(), "/p", k, "x"); w.Code != 400 {
			t.Errorf("key %q: %d, want 400", k, w.Code)
		}
	}
	if c.runs.Load() != 0 {
		t.Errorf("%d runs for invalid keys", c.runs.Load())
	}
	if !validIdemKey(strings.Repeat("a", 255)) || !validIdemKey("550e8400-e29b-41d4-a716-446655440000") {
		t.Error("valid keys refused")
	}
}
