# ramify: make run (set up, build, serve) and make test (the whole suite, as CI runs it).
GO        ?= go
BIN       := bin/ramify
VERSION   ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
IMAGE_DIR ?= /var/cache/ramify/images
DATA_DIR  ?= /var/lib/ramify

.PHONY: all build forkchild setup run image test test-go test-race test-sdk test-ts test-console-firefox test-openapi test-examples test-fuzz bench vet clean

all: build

# The in-sandbox program (internal/guest: family init and agents) is linked on its own, without the server's
# libraries, and embedded in the ramify binary; it is removed after each build so that a plain go build never
# embeds a stale one (cmd/ramify/embedded/README.md).
# The interpreter loop is compiled ahead as well when a python3 is at hand (internal/agent/compiled/README.md).
GUEST := cmd/ramify/embedded/ramify-guest
REPLC := internal/agent/compiled/repl.pyc
PYTHON ?= $(firstword $(wildcard /usr/bin/python3) python3)
with-guest = { $(PYTHON) scripts/compile-repl || rm -f $(REPLC); } && CGO_ENABLED=0 $(GO) build -trimpath -o $(GUEST) ./internal/guest && { $(1); s=$$?; rm -f $(GUEST) $(REPLC); exit $$s; }

build:
	$(call with-guest,CGO_ENABLED=0 $(GO) build -trimpath -ldflags "-X main.version=$(VERSION)" -o $(BIN) ./cmd/ramify)

setup:
	@./scripts/setup

# Rebuild the fork child helper (internal/agent/forkchild) after changing its C source; the .so is committed.
forkchild:
	./scripts/build-forkchild

# Set up the host, build, and serve on 127.0.0.1:7070. The first start builds the default image (about a minute).
run: setup build
	$(BIN) serve --data-dir $(DATA_DIR) --image-dir $(IMAGE_DIR)

image: setup build
	$(BIN) image build --image-dir $(IMAGE_DIR) --force=false

vet:
	$(GO) vet ./...

# The whole suite: Go unit and integration tests (real sandboxes), the race detector on the service layer,
# and the Python SDK against a real server.
test: setup build image vet test-go test-race test-sdk test-ts test-console-firefox test-openapi test-examples test-fuzz

# RAMIFY_REQUIRE_S3=1: the S3 snapshot store's tests fail, rather than skip, if their real S3 server (versitygw,
# built from the Go module proxy on first use) cannot be built; RAMIFY_REQUIRE_BROWSER=1: the console's browser test
# (tests/console, headless Chromium) fails, rather than skips, without chromium. It saves its screenshots in
# bin/test-artifacts/console.
test-go:
	RAMIFY_REQUIRE_S3=1 RAMIFY_REQUIRE_BROWSER=1 RAMIFY_TEST_ARTIFACTS=$(abspath bin/test-artifacts) RAMIFY_TEST_BINARY=$(abspath $(BIN)) RAMIFY_TEST_IMAGE_DIR=$(IMAGE_DIR) $(GO) test -count=1 -timeout 20m ./...

# The race detector on the concurrent core: a -race build of the server (sandbox service, API, runtime) runs the
# integration tests that race forks, merges, pauses and deletes against each other; the family init and the
# agents run the static in-sandbox program it embeds. Then every test of the sandbox service itself, on the fake
# runtime (no root).
test-race: build
	$(call with-guest,$(GO) build -race -o bin/ramify-race ./cmd/ramify)
	GORACE=halt_on_error=1 RAMIFY_TEST_BINARY=$(abspath bin/ramify-race) RAMIFY_TEST_IMAGE_DIR=$(IMAGE_DIR) \
		$(GO) test -race -count=1 -timeout 15m -run 'Concurrent|Race|Merge|ForkChildren|ForkMany|SpareAgents|SparesAhead|BadInput|Restart' ./tests/integration/
	GORACE=halt_on_error=1 $(GO) test -race -count=1 -timeout 5m ./internal/sandbox/

test-sdk:
	RAMIFY_TEST_BINARY=$(abspath $(BIN)) RAMIFY_TEST_IMAGE_DIR=$(IMAGE_DIR) ./scripts/test-sdk

# Every Go fuzz target (func FuzzXxx in a _test.go file under internal/ or cmd/) fuzzes for FUZZTIME on top of its
# committed corpus (testdata/fuzz/FuzzXxx); plain go test (test-go) already runs the corpora. A failing input is
# written to the package's testdata/fuzz/FuzzXxx: commit it with the fix. Most targets need root (chown, mknod).
# A count of executions, not a duration: with a duration, Go 1.26's fuzzing coordinator can report its own
# deadline as a failure ("context deadline exceeded", no failing input; golang/go#75804, fixed in Go 1.27).
FUZZTIME ?= 1000x
test-fuzz:
	@set -e; for f in $$(grep -rl --include='*_test.go' '^func Fuzz' internal cmd | sort); do \
		for fn in $$(sed -n 's/^func \(Fuzz[A-Za-z0-9_]*\)(.*/\1/p' $$f); do \
			echo "fuzz ./$$(dirname $$f) $$fn for $(FUZZTIME)"; \
			$(GO) test -run '^$$' -fuzz "^$$fn\$$" -fuzztime $(FUZZTIME) -fuzzminimizetime 5s -timeout 5m ./$$(dirname $$f); \
		done; \
	done

# The TypeScript SDK (node's test runner) against a real server, and `ramify mcp` driven by the official MCP
# TypeScript client and the MCP inspector's CLI (tests/mcp).
test-ts:
	RAMIFY_TEST_BINARY=$(abspath $(BIN)) RAMIFY_TEST_IMAGE_DIR=$(IMAGE_DIR) ./scripts/test-ts

# The web console in headless Firefox (Debian's firefox-esr, driven by puppeteer-core over WebDriver BiDi) against a
# real server; test-go drives it in Chromium (tests/console). Screenshots in bin/test-artifacts/console-firefox.
test-console-firefox:
	RAMIFY_TEST_ARTIFACTS=$(abspath bin/test-artifacts) RAMIFY_TEST_BINARY=$(abspath $(BIN)) RAMIFY_TEST_IMAGE_DIR=$(IMAGE_DIR) ./scripts/test-console-firefox

# The OpenAPI document through third-party tools: Redocly's linter, and a client generated from it compiled with
# tsc --strict (tests/openapi). Real responses are checked against it by internal/api's contract test (test-go).
test-openapi:
	./scripts/lint-openapi

# Every example in examples/ against a real server.
test-examples:
	RAMIFY_TEST_BINARY=$(abspath $(BIN)) RAMIFY_TEST_IMAGE_DIR=$(IMAGE_DIR) ./scripts/test-examples

BENCH ?= .
bench: build image
	RAMIFY_TEST_BINARY=$(abspath $(BIN)) RAMIFY_TEST_IMAGE_DIR=$(IMAGE_DIR) $(GO) test -run '^$$' -bench '$(BENCH)' -benchtime 1x -timeout 60m ./tests/bench/

clean:
	rm -rf bin
