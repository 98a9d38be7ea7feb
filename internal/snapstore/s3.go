package snapstore

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"

	"github.com/ramify-dev/ramify/internal/errdefs"
)

// S3Config configures an S3 store.
type S3Config struct {
	// Endpoint is host:port of the S3 API (no scheme).
	Endpoint string
	// Secure selects HTTPS.
	Secure bool
	// Region is the bucket's region ("" lets the client discover it, "us-east-1" where it cannot).
	Region string
	// Bucket is created if missing.
	Bucket string
	// Prefix, if not empty, is prepended (with a "/") to every key.
	Prefix string
	// AccessKey and SecretKey are static credentials.
	AccessKey, SecretKey string
}

// S3 is a Store in an S3-compatible object store.
//
// Put streams straight to the object's key with a multipart upload (s3Parallel parts of s3PartSize in flight,
// hence objects up to s3PartSize*10000 = 160 GiB), hashing on the way. S3 makes the object visible only when the
// upload completes, and a failed upload is aborted, so an object is never seen torn and a failed Put leaves the
// previous one intact. The checksum (CRC-32C) is known only at the end of the stream, when S3 no longer takes
// metadata, so Stat and List report one only for objects that carry it (x-amz-meta-sha256, as written by older versions, which
// published each object by a server-side copy: that copy cost as much as the upload); the snapshot manifest holds
// every part's checksum. Uploads left incomplete by a crash are aborted by NewS3 once a day old.
type S3 struct {
	client *minio.Client
	bucket string
	prefix string // "" or ending in "/"
}

// s3PartSize is the multipart part size of Put.
const s3PartSize = 16 << 20

// s3Parallel is how many parts of a Put are in flight at once; it holds a buffer of s3PartSize for each.
const s3Parallel = 4

// NewS3 connects to an S3-compatible store and creates the bucket if it does not exist.
func NewS3(ctx context.Context, c S3Config) (*S3, error) {
	if c.Endpoint == "" || c.Bucket == "" {
		return nil, fmt.Errorf("%w: s3 snapshot store: endpoint and bucket are required", errdefs.ErrInvalid)
	}
	prefix := strings.Trim(c.Prefix, "/")
	if prefix != "" {
		if err := ValidateKey(prefix); err != nil {
			return nil, fmt.Errorf("s3 snapshot store prefix: %w", err)
		}
		prefix += "/"
	}
	client, err := minio.New(c.Endpoint, &minio.Options{
		Creds:  credentials.NewStaticV4(c.AccessKey, c.SecretKey, ""),
		Secure: c.Secure,
		Region: c.Region,
	})
	if err != nil {
		return nil, fmt.Errorf("%w: s3 snapshot store: %v", errdefs.ErrInvalid, err)
	}
	s := &S3{client: client, bucket: c.Bucket, prefix: prefix}
	exists, err := client.BucketExists(ctx, c.Bucket)
	if err != nil {
		return nil, fmt.Errorf("s3 snapshot store %s: %w", s.Name(), err)
	}
	if !exists {
		err := client.MakeBucket(ctx, c.Bucket, minio.MakeBucketOptions{Region: c.Region})
		if err != nil {
			code := minio.ToErrorResponse(err).Code
			if code != "BucketAlreadyOwnedByYou" && code != "BucketAlreadyExists" {
				return nil, fmt.Errorf("s3 snapshot store %s: create bucket: %w", s.Name(), err)
			}
		}
	}
	s.cleanTmp(ctx, 24*time.Hour)
	return s, nil
}

// Name is "s3://bucket/prefix".
func (s *S3) Name() string { return "s3://" + s.bucket + "/" + strings.TrimSuffix(s.prefix, "/") }

func (s *S3) tmpPrefix() string { return s.prefix + tmpName + "/" }

// cleanTmp deletes temporary objects (written by older versions) and aborts incomplete uploads older than age
// (best effort).
func (s *S3) cleanTmp(ctx context.Context, age time.Duration) {
	old := make(chan minio.ObjectInfo)
	go func() {
		defer close(old)
		for o := range s.client.ListObjects(ctx, s.bucket, minio.ListObjectsOptions{Prefix: s.tmpPrefix(), Recursive: true}) {
			if o.Err == nil && time.Since(o.LastModified) > age {
				select {
				case old <- o:
				case <-ctx.Done():
					return
				}
			}
		}
	}()
	for range s.client.RemoveObjects(ctx, s.bucket, old, minio.RemoveObjectsOptions{}) {
	}
	for u := range s.client.ListIncompleteUploads(ctx, s.bucket, s.prefix, true) {
		if u.Err == nil && time.Since(u.Initiated) > age {
			_ = s.client.RemoveIncompleteUpload(ctx, s.bucket, u.Key)
		}
	}
}

// mapErr turns "no such key" into errdefs.ErrNotFound.
func mapErr(op, key string, err error) error {
	resp := minio.ToErrorResponse(err)
	if resp.Code == "NoSuchKey" || resp.Code == "NotFound" || resp.StatusCode == http.StatusNotFound {
		return fmt.Errorf("%s %s: %w", op, key, errdefs.ErrNotFound)
	}
	return fmt.Errorf("%s %s: %w", op, key, err)
}

// countingReader hashes and counts what passes through it.
type countingReader struct {
	r io.Reader
	h interface{ Write([]byte) (int, error) }
	n int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	c.h.Write(p[:n])
	return n, err
}

// Put streams r to the object, computing its checksum on the way: an object that fits in one part in a single
// request, a larger one as a multipart upload with parts in flight (s3put.go).
func (s *S3) Put(ctx context.Context, key string, r io.Reader) (Object, error) {
	if err := ValidateKey(key); err != nil {
		return Object{}, err
	}
	h := NewCRC32C()
	cr := &countingReader{r: ctxReader{ctx, r}, h: h}
	first := partBuffers.Get().(*[]byte)
	defer partBuffers.Put(first)
	n, err := io.ReadFull(cr, *first)
	switch {
	case err == io.EOF || err == io.ErrUnexpectedEOF:
		err = s.putOne(ctx, s.prefix+key, (*first)[:n])
	case err == nil:
		err = s.putMultipart(ctx, s.prefix+key, *first, cr, s3PutOptions)
	}
	if err == nil {
		err = ctx.Err()
	}
	if err != nil {
		return Object{}, fmt.Errorf("put %s: %w", key, err)
	}
	return Object{Key: key, Size: cr.n, Sum: Sum{}.Of(h)}, nil
}

// putOne stores data, at most a part, in a single request.
func (s *S3) putOne(ctx context.Context, object string, data []byte) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	watch := newStallWatch(cancel)
	defer watch.Close()
	defer watch.begin()()
	_, err := s.client.PutObject(ctx, s.bucket, object, &progressReader{bytes.NewReader(data), watch}, int64(len(data)), s3PutOptions)
	return stalled(ctx, err)
}

// s3PutOptions are the options of every object Put writes.
var s3PutOptions = minio.PutObjectOptions{ContentType: "application/octet-stream"}

// partBuffers holds the first part's buffer of Puts between them.
var partBuffers = sync.Pool{New: func() any { b := make([]byte, s3PartSize); return &b }}

// copy copies object src (which must still have etag, if given) to dst with sha256 metadata, server-side.
func (s *S3) copy(ctx context.Context, src, etag, dst, sum string) error {
	meta := map[string]string{}
	if sum != "" {
		meta["sha256"] = sum
	}
	_, err := s.client.ComposeObject(ctx,
		minio.CopyDestOptions{Bucket: s.bucket, Object: dst, ReplaceMetadata: true, UserMetadata: meta},
		minio.CopySrcOptions{Bucket: s.bucket, Object: src, MatchETag: etag})
	return err
}

// Get opens a streaming GET of the object.
func (s *S3) Get(ctx context.Context, key string) (io.ReadCloser, error) {
	if err := ValidateKey(key); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancelCause(ctx)
	watch := newStallWatch(cancel)
	obj, err := s.client.GetObject(ctx, s.bucket, s.prefix+key, minio.GetObjectOptions{})
	if err != nil {
		watch.Close()
		cancel(nil)
		return nil, mapErr("get", key, err)
	}
	end := watch.begin()
	info, err := obj.Stat() // sends the request
	end()
	if err != nil {
		obj.Close()
		watch.Close()
		cancel(nil)
		return nil, mapErr("get", key, stalled(ctx, err))
	}
	return &watchedBody{rc: obj, ctx: ctx, cancel: cancel, w: watch, size: info.Size}, nil
}

// Stat returns the object's size and its x-amz-meta-sha256.
func (s *S3) Stat(ctx context.Context, key string) (Object, error) {
	if err := ValidateKey(key); err != nil {
		return Object{}, err
	}
	info, err := s.client.StatObject(ctx, s.bucket, s.prefix+key, minio.StatObjectOptions{})
	if err != nil {
		return Object{}, mapErr("stat", key, err)
	}
	return Object{Key: key, Size: info.Size, Sum: Sum{SHA256: metaSHA256(info)}}, nil
}

func metaSHA256(info minio.ObjectInfo) string {
	for k, v := range info.UserMetadata {
		if strings.EqualFold(k, "sha256") || strings.EqualFold(k, "x-amz-meta-sha256") {
			return v
		}
	}
	return ""
}

// Copy copies src to dst server-side, carrying the checksum over.
func (s *S3) Copy(ctx context.Context, src, dst string) error {
	if err := ValidateKey(dst); err != nil {
		return err
	}
	if err := ValidateKey(src); err != nil {
		return err
	}
	info, err := s.client.StatObject(ctx, s.bucket, s.prefix+src, minio.StatObjectOptions{})
	if err != nil {
		return mapErr("copy", src, err)
	}
	if err := s.copy(ctx, s.prefix+src, info.ETag, s.prefix+dst, metaSHA256(info)); err != nil {
		return fmt.Errorf("copy %s to %s: %w", src, dst, mapErr("copy", src, err))
	}
	return nil
}

// list returns the full object names under prefix, leaving out temporary objects.
func (s *S3) list(ctx context.Context, prefix string) ([]minio.ObjectInfo, error) {
	var out []minio.ObjectInfo
	for o := range s.client.ListObjects(ctx, s.bucket, minio.ListObjectsOptions{Prefix: s.prefix + prefix, Recursive: true}) {
		if o.Err != nil {
			return nil, fmt.Errorf("list %s: %w", prefix, o.Err)
		}
		if strings.HasPrefix(o.Key, s.tmpPrefix()) || strings.HasSuffix(o.Key, "/") {
			continue
		}
		out = append(out, o)
	}
	return out, nil
}

// Delete removes the objects under prefix with multi-object deletes.
func (s *S3) Delete(ctx context.Context, prefix string) error {
	if prefix == "" {
		return fmt.Errorf("%w: delete: empty prefix", errdefs.ErrInvalid)
	}
	if err := validatePrefix(prefix); err != nil {
		return err
	}
	objs, err := s.list(ctx, prefix)
	if err != nil {
		return err
	}
	ch := make(chan minio.ObjectInfo, len(objs))
	for _, o := range objs {
		ch <- minio.ObjectInfo{Key: o.Key}
	}
	close(ch)
	var errs []error
	for e := range s.client.RemoveObjects(ctx, s.bucket, ch, minio.RemoveObjectsOptions{}) {
		if e.Err != nil && minio.ToErrorResponse(e.Err).Code != "NoSuchKey" {
			errs = append(errs, fmt.Errorf("%s: %w", strings.TrimPrefix(e.ObjectName, s.prefix), e.Err))
		}
	}
	if len(errs) > 0 {
		return fmt.Errorf("delete %s: %w", prefix, errors.Join(errs...))
	}
	return nil
}

// List lists the objects under prefix; the checksums come from one HEAD request per object (eight at a
// time), as S3 listings carry no user metadata.
func (s *S3) List(ctx context.Context, prefix string) ([]Object, error) {
	if err := validatePrefix(prefix); err != nil {
		return nil, err
	}
	infos, err := s.list(ctx, prefix)
	if err != nil {
		return nil, err
	}
	out := make([]Object, len(infos))
	errs := make([]error, len(infos))
	gone := make([]bool, len(infos))
	sem := make(chan struct{}, 8)
	var wg sync.WaitGroup
	for i, o := range infos {
		out[i] = Object{Key: strings.TrimPrefix(o.Key, s.prefix), Size: o.Size}
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			info, err := s.client.StatObject(ctx, s.bucket, o.Key, minio.StatObjectOptions{})
			if err != nil {
				if minio.ToErrorResponse(err).StatusCode == http.StatusNotFound {
					gone[i] = true // deleted since the listing
				} else {
					errs[i] = err
				}
				return
			}
			out[i].Size, out[i].Sum = info.Size, Sum{SHA256: metaSHA256(info)}
		}()
	}
	wg.Wait()
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("list %s: %w", prefix, err)
	}
	kept := out[:0]
	for i, o := range out {
		if !gone[i] {
			kept = append(kept, o)
		}
	}
	out = kept
	sort.Slice(out, func(i, j int) bool { return out[i].Key < out[j].Key })
	return out, nil
}

// tmpObjects lists the temporary objects and incomplete uploads of unfinished Puts (for tests).
func (s *S3) tmpObjects(ctx context.Context) ([]string, error) {
	var out []string
	for o := range s.client.ListObjects(ctx, s.bucket, minio.ListObjectsOptions{Prefix: s.tmpPrefix(), Recursive: true}) {
		if o.Err != nil {
			return nil, o.Err
		}
		out = append(out, o.Key)
	}
	for u := range s.client.ListIncompleteUploads(ctx, s.bucket, s.prefix, true) {
		if u.Err != nil {
			return nil, u.Err
		}
		out = append(out, "upload of "+u.Key)
	}
	return out, nil
}
