package main

import (
	"embed"
	"errors"
	"io/fs"
)

// The in-sandbox program, when make build linked one (see embedded/README.md).
//
//go:embed all:embedded
var embedded embed.FS

// guestProgram returns the embedded in-sandbox program, or nil when this binary was built without one.
func guestProgram() ([]byte, error) {
	b, err := embedded.ReadFile("embedded/ramify-guest")
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	return b, err
}
