package integration

import (
	"os"
	"testing"

	"github.com/ramify-dev/ramify/internal/s3test"
)

func TestMain(m *testing.M) {
	code := m.Run()
	s3test.Stop()
	os.Exit(code)
}
