package bench

import (
	"fmt"
	"os"
	"testing"

	"github.com/ramify-dev/ramify/internal/s3test"
)

// s3Args starts a real S3-compatible server on loopback for the benchmark and returns the serve flags that
// point ramify at it.
func s3Args(b *testing.B) ([]string, bool) {
	endpoint := s3test.Endpoint(b)
	return []string{"--s3-endpoint", endpoint, "--s3-bucket", fmt.Sprintf("ramify-bench-%d", os.Getpid()),
		"--s3-access-key", s3test.AccessKey, "--s3-secret-key", s3test.SecretKey}, true
}

func TestMain(m *testing.M) {
	code := m.Run()
	s3test.Stop()
	os.Exit(code)
}
