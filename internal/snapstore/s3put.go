package snapstore

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"sort"
	"sync"
	"time"

	"github.com/minio/minio-go/v7"
)

// An S3 Put is a multipart upload with up to s3Parallel parts in flight: the next part is read from the stream
// while the last ones are sent. One part at a time serialized the two (the pipe from the interpreter waited
// while a part went out, the upload while the pipe filled); an S3 service also gives several streams far more
// than one (AWS documents parallel parts as the way to its throughput). Buffers (s3Parallel of s3PartSize) are
// reused from part to part. When the stream or a part fails, or ctx ends, no new part is started, the parts in
// flight are let finish (they are bounded and would otherwise race the abort: a part the server is still
// writing when the upload is aborted can leave it behind) and then the upload is aborted.

// s3AbortGrace is how long the parts in flight of a failed Put may take to finish, and its abort to answer;
// s3AbortStall how long they may go without a byte moving meanwhile (a service that stopped answering).
var (
	s3AbortGrace = 30 * time.Second
	s3AbortStall = 5 * time.Second
)

// s3CompleteTimeout bounds the request that completes a multipart upload (a service may assemble the object
// before it answers).
const s3CompleteTimeout = 10 * time.Minute

// partResult is an uploaded part, or why it failed.
type partResult struct {
	part minio.CompletePart
	err  error
}

// putMultipart uploads r (already read up to first, a full part) to object as a multipart upload.
func (s *S3) putMultipart(ctx context.Context, object string, first []byte, r io.Reader, opts minio.PutObjectOptions) (err error) {
	core := minio.Core{Client: s.client}
	// Parts run on a context of their own, which the caller's end does not cancel (they finish, within
	// s3AbortGrace, before the abort) and the stall watch does.
	partCtx, cancelParts := context.WithCancelCause(context.WithoutCancel(ctx))
	defer cancelParts(nil)
	watch := newStallWatch(cancelParts)
	defer watch.Close()
	end := watch.begin()
	uploadID, err := core.NewMultipartUpload(partCtx, s.bucket, object, opts)
	end()
	if err != nil {
		return fmt.Errorf("start multipart upload: %w", stalled(partCtx, err))
	}
	free := make(chan []byte, s3Parallel)
	for i := 1; i < s3Parallel; i++ {
		free <- make([]byte, s3PartSize)
	}
	var (
		wg     sync.WaitGroup
		mu     sync.Mutex
		parts  []minio.CompletePart
		failed error // the first part that failed
	)
	send := func(n int, buf []byte) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			end := watch.begin()
			p, perr := core.PutObjectPart(partCtx, s.bucket, object, uploadID, n, &progressReader{bytes.NewReader(buf), watch},
				int64(len(buf)), minio.PutObjectPartOptions{})
			end()
			mu.Lock()
			if perr != nil && failed == nil {
				failed = fmt.Errorf("part %d: %w", n, perr)
			}
			parts = append(parts, minio.CompletePart{PartNumber: p.PartNumber, ETag: p.ETag})
			mu.Unlock()
			free <- buf[:cap(buf)]
		}()
	}
	partFailed := func() error {
		mu.Lock()
		defer mu.Unlock()
		return failed
	}
	buf := first
	for n := 1; ; n++ {
		send(n, buf)
		if len(buf) < s3PartSize {
			break // the stream ended in this part
		}
		if n == s3MaxParts {
			err = fmt.Errorf("object larger than %d parts of %d MiB", s3MaxParts, s3PartSize>>20)
			break
		}
		select {
		case buf = <-free:
		case <-ctx.Done():
		case <-partCtx.Done():
		}
		if err = errors.Join(ctx.Err(), partFailed(), context.Cause(partCtx)); err != nil {
			break
		}
		k, rerr := io.ReadFull(r, buf)
		if rerr == io.EOF {
			free <- buf
			break // the stream ended with the last part
		}
		if rerr != nil && rerr != io.ErrUnexpectedEOF {
			free <- buf
			err = rerr
			break
		}
		buf = buf[:k]
	}
	if err != nil {
		// The parts in flight finish before the abort, so that none lands after it: while bytes move, within
		// s3AbortGrace.
		watch.tighten(s3AbortStall)
		t := time.AfterFunc(s3AbortGrace, func() { cancelParts(errors.New("the parts in flight of a failed upload took too long")) })
		defer t.Stop()
	}
	wg.Wait()
	if err == nil {
		err = errors.Join(ctx.Err(), partFailed())
	}
	abort := func(err error) error {
		grace := s3AbortGrace
		do := func() error {
			actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), grace)
			defer cancel()
			return core.AbortMultipartUpload(actx, s.bucket, object, uploadID)
		}
		if errors.Is(context.Cause(partCtx), errStalled) {
			// The service stopped answering: the abort is tried in the background (the start of the next
			// server aborts uploads a day old), not waited on by the failed Put.
			go do() //nolint:errcheck // best effort
			return err
		}
		if aerr := do(); aerr != nil {
			err = errors.Join(err, fmt.Errorf("abort the upload: %w", aerr))
		}
		return err
	}
	if err != nil {
		return abort(stalled(partCtx, err))
	}
	sort.Slice(parts, func(i, j int) bool { return parts[i].PartNumber < parts[j].PartNumber })
	cctx, cancel := context.WithTimeout(ctx, s3CompleteTimeout)
	defer cancel()
	if _, err := core.CompleteMultipartUpload(cctx, s.bucket, object, uploadID, parts, minio.PutObjectOptions{}); err != nil {
		return abort(fmt.Errorf("complete multipart upload: %w", err))
	}
	return nil
}

// s3MaxParts is the most parts of a multipart upload (S3's limit).
const s3MaxParts = 10000
