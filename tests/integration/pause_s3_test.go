package integration

import (
	"fmt"
	"os"
	"testing"

	"github.com/ramify-dev/ramify/internal/s3test"
	"github.com/ramify-dev/ramify/internal/testserver"
)

// Pause and resume with snapshots in an S3-compatible store: a real versitygw server on loopback.
func TestPauseResumeWithS3Store(t *testing.T) {
	endpoint := s3test.Endpoint(t)
	bucket := fmt.Sprintf("ramify-it-%d", os.Getpid())
	s := testserver.Start(t, "--s3-endpoint", endpoint, "--s3-bucket", bucket, "--s3-prefix", "snaps/",
		"--s3-access-key", s3test.AccessKey, "--s3-secret-key", s3test.SecretKey)
	ctx := ctxT(t)
	id := create(t, s, nil)
	value(t, s, id, sessionSetup)
	sh(t, s, id, "head -c 2000000 /dev/urandom > /root/blob")
	sum := sh(t, s, id, "sha256sum /root/blob").Stdout
	pauseAndWait(t, s, id)
	// Survives a restart; resumes from the bucket.
	s.Restart()
	resumeAndWait(t, s, id)
	if v := value(t, s, id, "(counter, m.predict(2), df.shape)"); v != "(41, 14, (1000, 2))" {
		t.Fatalf("session from S3: %s", v)
	}
	if r := sh(t, s, id, "sha256sum /root/blob"); r.Stdout != sum {
		t.Fatalf("file from S3: %q", r.Stdout)
	}
	// Fork of a paused sandbox copies its objects server-side.
	pauseAndWait(t, s, id)
	kids, err := s.Client.Fork(ctx, id, 1)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := s.Client.WaitStatus(ctx, kids[0], "running"); err != nil {
		t.Fatal(err)
	}
	if v := value(t, s, kids[0], "counter"); v != "41" {
		t.Fatalf("fork from S3 snapshot: %s", v)
	}
}
