package snapstore

import (
	"context"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/ramify-dev/ramify/internal/s3test"
)

func TestMain(m *testing.M) {
	code := m.Run()
	s3test.Stop()
	os.Exit(code)
}

var bucketSeq struct {
	sync.Mutex
	n int
}

// newTestS3 returns an S3 store on a fresh bucket (created by NewS3) with a prefix.
func newTestS3(t testing.TB) *S3 {
	endpoint := s3test.Endpoint(t)
	bucketSeq.Lock()
	bucketSeq.n++
	n := bucketSeq.n
	bucketSeq.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	s, err := NewS3(ctx, S3Config{
		Endpoint:  endpoint,
		Region:    "us-east-1",
		Bucket:    fmt.Sprintf("ramify-test-%d-%s", n, randomName()[:8]),
		Prefix:    "/snapshots/",
		AccessKey: s3test.AccessKey,
		SecretKey: s3test.SecretKey,
	})
	if err != nil {
		t.Fatal(err)
	}
	return s
}
