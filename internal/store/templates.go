package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/ramify-dev/ramify/internal/errdefs"
)

// Template is a named capture of a sandbox as persisted: its snapshot's key prefix in the snapshot store, the
// spec new sandboxes start with, and what the capture reported (Info, opaque to the store).
type Template struct {
	Name      string
	From      string // the sandbox it was captured from
	CreatedAt time.Time
	Snapshot  string          // key prefix of its snapshot
	Spec      json.RawMessage // the captured sandbox's spec
	Info      json.RawMessage // size, what could not be saved
}

const templateSchema = `
CREATE TABLE IF NOT EXISTS templates (
	name       TEXT PRIMARY KEY,
	from_id    TEXT NOT NULL DEFAULT '',
	created_at TEXT NOT NULL,
	snapshot   TEXT NOT NULL,
	spec       TEXT NOT NULL DEFAULT '{}',
	info       TEXT NOT NULL DEFAULT '{}'
);
`

const templateCols = `name, from_id, created_at, snapshot, spec, info`

// AddTemplate records a new template; errdefs.ErrConflict when one of that name exists.
func (s *Store) AddTemplate(ctx context.Context, t Template) error {
	_, err := s.db.ExecContext(ctx, `INSERT INTO templates (`+templateCols+`) VALUES (?,?,?,?,?,?)`,
		t.Name, t.From, t.CreatedAt.UTC().Format(time.RFC3339Nano), t.Snapshot, orEmpty(t.Spec), orEmpty(t.Info))
	if err != nil && strings.Contains(err.Error(), "UNIQUE") {
		return errdefs.New(errdefs.ErrConflict, fmt.Sprintf("template %q already exists", t.Name))
	}
	if err != nil {
		return fmt.Errorf("save template %s: %w", t.Name, err)
	}
	return nil
}

func scanTemplate(row interface{ Scan(...any) error }) (Template, error) {
	var t Template
	var created, spec, info string
	if err := row.Scan(&t.Name, &t.From, &created, &t.Snapshot, &spec, &info); err != nil {
		return t, err
	}
	t.CreatedAt, _ = time.Parse(time.RFC3339Nano, created)
	t.Spec, t.Info = json.RawMessage(spec), json.RawMessage(info)
	return t, nil
}

// GetTemplate returns one template; errdefs.ErrNotFound if absent.
func (s *Store) GetTemplate(ctx context.Context, name string) (Template, error) {
	t, err := scanTemplate(s.db.QueryRowContext(ctx, `SELECT `+templateCols+` FROM templates WHERE name = ?`, name))
	if errors.Is(err, sql.ErrNoRows) {
		return t, errdefs.New(errdefs.ErrNotFound, fmt.Sprintf("template %q not found", name))
	}
	if err != nil {
		return t, fmt.Errorf("read template %s: %w", name, err)
	}
	return t, nil
}

// ListTemplates returns every template, by name.
func (s *Store) ListTemplates(ctx context.Context) ([]Template, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT `+templateCols+` FROM templates ORDER BY name`)
	if err != nil {
		return nil, fmt.Errorf("list templates: %w", err)
	}
	defer rows.Close()
	out := []Template{}
	for rows.Next() {
		t, err := scanTemplate(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, t)
	}
	return out, rows.Err()
}

// DeleteTemplate removes a template's record; errdefs.ErrNotFound if absent.
func (s *Store) DeleteTemplate(ctx context.Context, name string) error {
	res, err := s.db.ExecContext(ctx, `DELETE FROM templates WHERE name = ?`, name)
	if err != nil {
		return fmt.Errorf("delete template %s: %w", name, err)
	}
	if n, _ := res.RowsAffected(); n == 0 {
		return errdefs.New(errdefs.ErrNotFound, fmt.Sprintf("template %q not found", name))
	}
	return nil
}
