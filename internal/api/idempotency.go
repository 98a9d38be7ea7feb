package api

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/ramify-dev/ramify/internal/errdefs"
)

// Idempotency keys. A POST that carries an Idempotency-Key header is done at most once: a call repeated with the
// same key and the same request (a client retrying after its connection broke, not knowing whether the server
// got the first one) gets the first call's answer again, marked Idempotent-Replayed: true, instead of a second
// fork, create or merge. A repeat that arrives while the first call still runs waits for its answer. A key used
// again with a different request (method, path, query or body) is refused with 422. Answers are kept for
// idemTTL, at most idemMaxKeys keys and idemMaxBytes of bodies (the oldest go first), in memory: a restart of
// the server forgets them. A first call that failed while its client had gone (its error may be the client's
// leaving, and a failed call changes nothing) or with a 5xx is not kept: a repeat runs again. An answer that was
// streamed (NDJSON progress) or that is larger than idemMaxBody cannot be replayed: a repeat gets 409 saying so.

// IdempotencyKeyHeader is the request header naming a call's idempotency key (the IETF httpapi draft's name).
const IdempotencyKeyHeader = "Idempotency-Key"

const (
	idemTTL      = 10 * time.Minute
	idemMaxKeys  = 10_000
	idemMaxBytes = 64 << 20
	idemMaxBody  = 4 << 20
	idemMaxKey   = 255
)

// errIdemMismatch is a key used again with a different request: 422.
var errIdemMismatch = errors.New("idempotency key reused with a different request")

type idemCall struct {
	fp   [sha256.Size]byte
	done chan struct{} // closed when the first call has answered; the fields below are set before
	// gone: the answer is not kept (the entry was removed); a waiting repeat runs the call itself.
	gone       bool
	replayable bool
	code       int
	header     http.Header
	body       []byte
	at         time.Time // when it answered (expiry, eviction order)
}

// idemStore holds the calls made with idempotency keys.
type idemStore struct {
	mu    sync.Mutex
	calls map[string]*idemCall
	order []string // keys of the answers kept, oldest first
	bytes int
	// The limits (idemTTL, idemMaxKeys, idemMaxBytes, idemMaxBody; tests lower them) and the clock.
	ttl                        time.Duration
	maxKeys, maxBytes, maxBody int
	now                        func() time.Time
}

func newIdemStore() *idemStore {
	return &idemStore{calls: map[string]*idemCall{}, ttl: idemTTL, maxKeys: idemMaxKeys, maxBytes: idemMaxBytes,
		maxBody: idemMaxBody, now: time.Now}
}

// validIdemKey says whether k can be an idempotency key: 1-255 visible ASCII characters.
func validIdemKey(k string) bool {
	if k == "" || len(k) > idemMaxKey {
		return false
	}
	for i := 0; i < len(k); i++ {
		if k[i] < 0x21 || k[i] > 0x7e {
			return false
		}
	}
	return true
}

// serve runs h for r (a POST carrying key) at most once per key and request, replaying its answer to repeats.
func (st *idemStore) serve(w http.ResponseWriter, r *http.Request, key string, h http.HandlerFunc) {
	if !validIdemKey(key) {
		writeError(w, errdefs.New(errdefs.ErrInvalid, fmt.Sprintf("%s must be 1 to %d visible ASCII characters", IdempotencyKeyHeader, idemMaxKey)))
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxJSONBody))
	if err != nil {
		writeError(w, fmt.Errorf("read request body: %w", err))
		return
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	hash := sha256.New()
	fmt.Fprintf(hash, "%s %s?%s\n", r.Method, r.URL.Path, r.URL.RawQuery)
	hash.Write(body)
	var fp [sha256.Size]byte
	hash.Sum(fp[:0])
	for {
		st.mu.Lock()
		st.expireLocked()
		c := st.calls[key]
		if c == nil {
			c = &idemCall{fp: fp, done: make(chan struct{})}
			st.calls[key] = c
			st.mu.Unlock()
			st.first(w, r, key, c, h)
			return
		}
		st.mu.Unlock()
		if c.fp != fp {
			writeError(w, fmt.Errorf("%w: %s %q was first used with another request (method, path or body); "+
				"use a new key for a new request", errIdemMismatch, IdempotencyKeyHeader, key))
			return
		}
		select {
		case <-c.done:
		case <-r.Context().Done():
			return // the client left: nobody to answer
		}
		if c.gone {
			continue // not kept: this repeat runs the call (unless another repeat got there first)
		}
		if !c.replayable {
			writeError(w, errdefs.New(errdefs.ErrConflict, fmt.Sprintf("the call first made with %s %q answered "+
				"with a stream or a body too large to keep, which cannot be replayed", IdempotencyKeyHeader, key)))
			return
		}
		for k, v := range c.header {
			w.Header()[k] = v
		}
		w.Header().Set("Idempotent-Replayed", "true")
		w.WriteHeader(c.code)
		w.Write(c.body) //nolint:errcheck // the client went away
		return
	}
}

// first runs h as the first call with key, recording its answer in c. The answer is kept unless it is a 5xx,
// or an error while the client had gone (perhaps because it had), or h panicked: then a repeat runs the call.
func (st *idemStore) first(w http.ResponseWriter, r *http.Request, key string, c *idemCall, h http.HandlerFunc) {
	rec := &idemRecorder{ResponseWriter: w, code: http.StatusOK, max: st.maxBody}
	keep := false
	defer func() { st.finish(key, c, rec, keep) }()
	h(rec, r)
	keep = rec.code < 500 && (rec.code < 400 || r.Context().Err() == nil)
}

// finish records rec's answer for key (keep), or forgets the call, and releases the repeats waiting on it.
func (st *idemStore) finish(key string, c *idemCall, rec *idemRecorder, keep bool) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if !rec.wroteHeader {
		rec.header = rec.Header().Clone()
	}
	if !keep {
		c.gone = true
		if st.calls[key] == c {
			delete(st.calls, key)
		}
		close(c.done)
		return
	}
	c.code, c.header, c.at = rec.code, rec.header, st.now()
	c.replayable = !rec.streamed && !rec.overflow
	if c.replayable {
		c.body = rec.buf.Bytes()
		st.bytes += len(c.body)
	}
	st.order = append(st.order, key)
	close(c.done)
	st.evictLocked()
}

// expireLocked forgets answers older than the store's ttl.
func (st *idemStore) expireLocked() {
	cut := st.now().Add(-st.ttl)
	for len(st.order) > 0 {
		c := st.calls[st.order[0]]
		if c != nil && !c.at.IsZero() && c.at.After(cut) {
			return
		}
		st.dropOldestLocked()
	}
}

// evictLocked forgets the oldest answers while more than maxKeys are kept or their bodies pass maxBytes.
func (st *idemStore) evictLocked() {
	for len(st.order) > 0 && (len(st.order) > st.maxKeys || st.bytes > st.maxBytes) {
		st.dropOldestLocked()
	}
}

func (st *idemStore) dropOldestLocked() {
	key := st.order[0]
	st.order = st.order[1:]
	if c := st.calls[key]; c != nil && !c.at.IsZero() {
		delete(st.calls, key)
		st.bytes -= len(c.body)
	}
}

// idemRecorder passes a first call's answer to its client and keeps a copy: its status, its headers as they
// were when it was sent, and its body up to idemMaxBody.
type idemRecorder struct {
	http.ResponseWriter
	code        int
	header      http.Header
	wroteHeader bool
	buf         bytes.Buffer
	max         int
	overflow    bool
	streamed    bool
}

func (w *idemRecorder) WriteHeader(code int) {
	if !w.wroteHeader {
		w.wroteHeader = true
		w.code = code
		w.header = w.Header().Clone()
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *idemRecorder) Write(p []byte) (int, error) {
	if !w.wroteHeader {
		w.WriteHeader(http.StatusOK)
	}
	if !w.overflow {
		if w.buf.Len()+len(p) > w.max {
			w.overflow = true
			w.buf = bytes.Buffer{}
		} else {
			w.buf.Write(p)
		}
	}
	return w.ResponseWriter.Write(p)
}

// Flush marks the answer streamed: what a repeat would get is not what the first caller saw as it came.
func (w *idemRecorder) Flush() {
	w.streamed = true
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

func (w *idemRecorder) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// idemKeyOf returns the idempotency key r carries, if it is a POST with one.
func idemKeyOf(r *http.Request) (string, bool) {
	if r.Method != http.MethodPost {
		return "", false
	}
	v, ok := r.Header[http.CanonicalHeaderKey(IdempotencyKeyHeader)]
	if !ok || len(v) == 0 {
		return "", false
	}
	return strings.TrimSpace(v[0]), true
}
