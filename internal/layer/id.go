package layer

import (
	"fmt"

	"github.com/ramify-dev/ramify/internal/errdefs"
)

// MaxIDLen is the longest layer id ValidateID accepts.
const MaxIDLen = 128

// ValidateID reports whether id is usable as a layer id: 1 to MaxIDLen characters from [A-Za-z0-9_.-], not
// starting with '.' (so ids can never be ".", ".." or one of the drivers' hidden temporary names). The error
// wraps errdefs.ErrInvalid and its message is safe to show to API users.
func ValidateID(id string) error {
	switch {
	case id == "":
		return errdefs.New(errdefs.ErrInvalid, "invalid layer id: empty")
	case len(id) > MaxIDLen:
		return errdefs.New(errdefs.ErrInvalid, fmt.Sprintf("invalid layer id: longer than %d characters", MaxIDLen))
	case id[0] == '.':
		return errdefs.New(errdefs.ErrInvalid, fmt.Sprintf("invalid layer id %q: must not start with '.'", id))
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '.' || c == '-') {
			return errdefs.New(errdefs.ErrInvalid,
				fmt.Sprintf("invalid layer id %q: only letters, digits, '_', '.' and '-' are allowed", id))
		}
	}
	return nil
}
