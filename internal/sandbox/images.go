package sandbox

// Images: a sandbox runs on the default image or on a named image (internal/image: built on top of the
// default one, kept in Config.ImageDir). The service builds, lists and removes named images, and keeps an image
// from being rebuilt or removed while a sandbox (running, paused or in error) or a template uses it: imgMu is
// held shared by every create on a named image from its check until its record is in s.items, and exclusively
// by a removal or a build's final check.

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/ramify-dev/ramify/internal/errdefs"
	"github.com/ramify-dev/ramify/internal/image"
)

// BuildImageRequest is the body of POST /v1/images.
type BuildImageRequest struct {
	Name string `json:"name"`
	// Apt are Debian packages to install on top of the default image.
	Apt []string `json:"apt,omitempty"`
	// Pip are pip requirements ("name", "name==1.2"), installed from PipIndex.
	Pip      []string `json:"pip,omitempty"`
	PipIndex string   `json:"pip_index,omitempty"`
}

// ImageInfo is the API view of an image.
type ImageInfo struct {
	Name      string    `json:"name"`
	ID        string    `json:"id"`
	Default   bool      `json:"default"` // the default image (built by ramify image build, no name)
	BaseID    string    `json:"base_id,omitempty"`
	Apt       []string  `json:"apt"`
	Pip       []string  `json:"pip"`
	PipIndex  string    `json:"pip_index,omitempty"`
	BuiltAt   time.Time `json:"built_at"`
	SizeBytes int64     `json:"size_bytes"` // a named image: of its own layer
	// Sandboxes and Templates count the sandboxes (any status) and templates on the image.
	Sandboxes int `json:"sandboxes"`
	Templates int `json:"templates"`
	// Error says why a named image cannot be used now (its base was rebuilt); empty when it can.
	Error string `json:"error,omitempty"`
}

var errNoImages = errdefs.New(errdefs.ErrConflict, "named images are not available on this server (no image directory)")

// imageName is the name a request's image field stands for: "" for the default image.
func imageName(name string) string {
	if name == image.DefaultName {
		return ""
	}
	return name
}

// checkImage returns nil when sandboxes can start on image name now ("" is the default image).
func (s *Service) checkImage(name string) error {
	if name == "" {
		return nil
	}
	if s.cfg.ImageDir == "" {
		return errNoImages
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.checkImageLocked(name)
}

// checkImageLocked is checkImage for a caller holding s.mu.
func (s *Service) checkImageLocked(name string) error {
	if s.cfg.ImageDir == "" {
		return errNoImages
	}
	if s.building[name] {
		return errdefs.New(errdefs.ErrConflict, fmt.Sprintf("image %q is being built", name))
	}
	_, err := image.Lowers(s.cfg.ImageDir, name)
	return err
}

// useImage checks that sandboxes can start on image name and holds it from removal until release.
func (s *Service) useImage(name string) (release func(), err error) {
	if name == "" {
		return func() {}, nil
	}
	s.imgMu.RLock()
	if err := s.checkImage(name); err != nil {
		s.imgMu.RUnlock()
		return nil, err
	}
	return s.imgMu.RUnlock, nil
}

// imageUsers counts the sandboxes and templates on image name. The caller holds imgMu.
func (s *Service) imageUsers(ctx context.Context, name string) (sandboxes, templates int, err error) {
	s.mu.Lock()
	for _, e := range s.items {
		if !e.gone && !e.pooled && imageName(e.spec.Image) == name {
			sandboxes++
		}
	}
	s.mu.Unlock()
	ts, err := s.ListTemplates(ctx)
	if err != nil && s.cfg.Snapshots != nil {
		return 0, 0, err
	}
	for _, t := range ts {
		if imageName(t.Spec.Image) == name {
			templates++
		}
	}
	return sandboxes, templates, nil
}

// inUse is the conflict for an image that sandboxes or templates use.
func inUse(name, what string, sandboxes, templates int) error {
	return errdefs.New(errdefs.ErrConflict, fmt.Sprintf("cannot %s image %q: %d sandboxes (running, paused or in error) and %d templates use it; delete them first, or build under another name",
		what, name, sandboxes, templates))
}

// CheckImageBuild validates a build request, and refuses one whose name is in use or being built, before the
// build starts (the API then streams its progress).
func (s *Service) CheckImageBuild(ctx context.Context, req BuildImageRequest) error {
	if s.cfg.ImageDir == "" {
		return errNoImages
	}
	if _, err := (image.NamedOptions{Name: req.Name, Apt: req.Apt, Pip: req.Pip, PipIndex: req.PipIndex}).Normalize(); err != nil {
		return err
	}
	s.imgMu.Lock()
	defer s.imgMu.Unlock()
	return s.reserveBuild(ctx, req.Name, false)
}

// imageFree refuses to act on image name (verb: "rebuild", "delete") while another build of it runs or
// sandboxes or templates use it. The caller holds imgMu.
func (s *Service) imageFree(ctx context.Context, name, verb string) error {
	s.mu.Lock()
	busy := s.building[name]
	s.mu.Unlock()
	if busy {
		return errdefs.New(errdefs.ErrConflict, fmt.Sprintf("image %q is being built", name))
	}
	nsb, ntp, err := s.imageUsers(ctx, name)
	if err != nil {
		return err
	}
	if nsb+ntp > 0 {
		return inUse(name, verb, nsb, ntp)
	}
	return nil
}

// reserveBuild refuses a build of name while sandboxes or templates use it or another build of it runs, and
// when take, marks it being built. The caller holds imgMu.
func (s *Service) reserveBuild(ctx context.Context, name string, take bool) error {
	if err := s.imageFree(ctx, name, "rebuild"); err != nil {
		return err
	}
	if take {
		s.mu.Lock()
		s.building[name] = true
		s.mu.Unlock()
	}
	return nil
}

// BuildImage builds (or rebuilds) a named image on top of the default one, writing progress lines to progress.
// Sandboxes cannot start on the name until it is done.
func (s *Service) BuildImage(ctx context.Context, req BuildImageRequest, progress io.Writer) (ImageInfo, error) {
	if s.cfg.ImageDir == "" {
		return ImageInfo{}, errNoImages
	}
	s.imgMu.Lock()
	err := s.reserveBuild(ctx, req.Name, true)
	s.imgMu.Unlock()
	if err != nil {
		return ImageInfo{}, err
	}
	defer func() {
		s.mu.Lock()
		delete(s.building, req.Name)
		s.mu.Unlock()
	}()
	start := time.Now()
	img, err := image.BuildNamed(ctx, image.NamedOptions{Dir: s.cfg.ImageDir, Name: req.Name, Apt: req.Apt, Pip: req.Pip,
		PipIndex: req.PipIndex, Progress: progress, Logger: s.log})
	if err != nil {
		return ImageInfo{}, err
	}
	s.log.Info("image built", "image", img.Name, "id", img.ID, "ms", time.Since(start).Milliseconds())
	return namedInfo(img), nil
}

func namedInfo(m image.NamedImage) ImageInfo {
	return ImageInfo{Name: m.Name, ID: m.ID, BaseID: m.BaseID, Apt: m.Apt, Pip: m.Pip, PipIndex: m.PipIndex,
		BuiltAt: m.BuiltAt, SizeBytes: m.SizeBytes}
}

// ListImages returns the default image and the named ones, with how many sandboxes and templates use each.
func (s *Service) ListImages(ctx context.Context) ([]ImageInfo, error) {
	if s.cfg.ImageDir == "" {
		return []ImageInfo{}, nil
	}
	out := []ImageInfo{}
	if d, err := s.GetImage(ctx, image.DefaultName); err == nil {
		out = append(out, d)
	}
	named, err := image.ListNamed(s.cfg.ImageDir)
	if err != nil {
		return nil, err
	}
	for _, m := range named {
		in, err := s.describe(ctx, namedInfo(m))
		if err != nil {
			return nil, err
		}
		out = append(out, in)
	}
	return out, nil
}

// GetImage returns one image ("default" is the default image).
func (s *Service) GetImage(ctx context.Context, name string) (ImageInfo, error) {
	if s.cfg.ImageDir == "" {
		return ImageInfo{}, errdefs.New(errdefs.ErrNotFound, fmt.Sprintf("image %q not found", name))
	}
	if name == image.DefaultName {
		d, err := image.Load(s.cfg.ImageDir)
		if err != nil {
			return ImageInfo{}, err
		}
		return s.describe(ctx, ImageInfo{Name: image.DefaultName, ID: d.ID, Default: true, Apt: []string{}, Pip: []string{},
			BuiltAt: d.BuiltAt, SizeBytes: d.SizeBytes})
	}
	m, err := image.LoadNamed(s.cfg.ImageDir, name)
	if err != nil {
		return ImageInfo{}, err
	}
	return s.describe(ctx, namedInfo(m))
}

// describe adds an image's users and whether it can be used now.
func (s *Service) describe(ctx context.Context, in ImageInfo) (ImageInfo, error) {
	var err error
	in.Sandboxes, in.Templates, err = s.imageUsers(ctx, imageName(in.Name))
	if err != nil {
		return in, err
	}
	if !in.Default {
		if _, lerr := image.Lowers(s.cfg.ImageDir, in.Name); errors.Is(lerr, errdefs.ErrConflict) {
			in.Error = lerr.Error()
		}
	}
	return in, nil
}

// DeleteImage removes a named image that no sandbox or template uses.
func (s *Service) DeleteImage(ctx context.Context, name string) error {
	if name == image.DefaultName {
		return errdefs.New(errdefs.ErrInvalid, "the default image cannot be deleted")
	}
	if s.cfg.ImageDir == "" {
		return errdefs.New(errdefs.ErrNotFound, fmt.Sprintf("image %q not found", name))
	}
	if _, err := image.LoadNamed(s.cfg.ImageDir, name); err != nil {
		return err
	}
	s.imgMu.Lock()
	defer s.imgMu.Unlock()
	if err := s.imageFree(ctx, name, "delete"); err != nil {
		return err
	}
	if err := image.RemoveNamed(ctx, s.cfg.ImageDir, name); err != nil {
		return err
	}
	s.log.Info("image deleted", "image", name)
	return nil
}

// imageForResume checks that a paused sandbox's image can still be had (called under s.mu).
func (s *Service) imageForResume(name string) error {
	if name == "" {
		return nil
	}
	if err := s.checkImageLocked(name); err != nil {
		return errdefs.New(errdefs.ErrConflict, fmt.Sprintf("cannot resume: the sandbox's image %q cannot be used: %v", name, err))
	}
	return nil
}
