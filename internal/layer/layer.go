// Package layer owns the sandboxes' writable file-system layers: directories that can be created, cloned
// (copy-on-write, O(1) where the file system allows it) and removed. Two drivers implement Driver: btrfs
// (subvolumes and snapshots through ioctls, on the data directory's own btrfs or on a loop-mounted btrfs image
// that ramify creates) and copy (a plain recursive copy, for hosts where btrfs is not available).
package layer

import "context"

// Driver creates, clones and removes layers. A layer is a directory named by an id; every method that takes
// an id refuses (with errdefs.ErrInvalid) ids that ValidateID rejects, such as ids containing '/' or starting
// with '.'. Errors wrap errdefs sentinels: ErrNotFound for a missing Clone source, ErrConflict for an existing
// Create or Clone destination. Open returns a Driver.
type Driver interface {
	// Name is "btrfs" or "copy".
	Name() string
	// Create makes a new, empty layer and returns its directory.
	Create(ctx context.Context, id string) (string, error)
	// Clone makes layer dst a copy of layer src as it is now and returns dst's directory. For btrfs this is a
	// snapshot: O(1), no data copied. The caller keeps src quiescent (frozen) while Clone runs.
	Clone(ctx context.Context, src, dst string) (string, error)
	// Remove deletes a layer and everything in it. Removing a layer that does not exist is not an error.
	Remove(ctx context.Context, id string) error
	// Path is the directory of layer id (whether or not it exists). It does not validate id: pass only ids
	// that ValidateID accepts.
	Path(id string) string
	// List returns the ids of all layers.
	List() ([]string, error)
	// Close releases what Open set up (it does not remove layers).
	Close() error
}
