# ramify: make run (set up, build, serve) and make test (the whole suite, as CI runs it).
GO        ?= go
BIN       := bin/ramify
VERSION   ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
IMAGE_DIR ?= /var/cache/ramify/images
DATA_DIR  ?= /var/lib/ramify

.PHONY: all build setup run image test test-go test-race test-sdk bench vet clean

all: build

build:
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags "-X main.version=$(VERSION)" -o $(BIN) ./cmd/ramify

setup:
	@./scripts/setup

# Set up the host, build, and serve on 127.0.0.1:7070. The first start builds the default image (about a minute).
run: setup build
	$(BIN) serve --data-dir $(DATA_DIR) --image-dir $(IMAGE_DIR)

image: setup build
	$(BIN) image build --image-dir $(IMAGE_DIR) --force=false

vet:
	$(GO) vet ./...

# The whole suite: Go unit and integration tests (real sandboxes), the race detector on the service layer,
# and the Python SDK against a real server.
test: setup build image vet test-go test-race test-sdk

test-go:
	RAMIFY_TEST_BINARY=$(abspath $(BIN)) RAMIFY_TEST_IMAGE_DIR=$(IMAGE_DIR) $(GO) test -count=1 -timeout 20m ./...

test-race:
	RAMIFY_TEST_BINARY=$(abspath $(BIN)) RAMIFY_TEST_IMAGE_DIR=$(IMAGE_DIR) $(GO) test -race -count=1 -timeout 10m ./internal/sandbox/ ./internal/agent/ ./internal/api/

test-sdk:
	RAMIFY_TEST_BINARY=$(abspath $(BIN)) RAMIFY_TEST_IMAGE_DIR=$(IMAGE_DIR) ./scripts/test-sdk

bench: build image
	RAMIFY_TEST_BINARY=$(abspath $(BIN)) RAMIFY_TEST_IMAGE_DIR=$(IMAGE_DIR) $(GO) test -run '^$$' -bench . -benchtime 1x -timeout 30m ./tests/bench/

clean:
	rm -rf bin
