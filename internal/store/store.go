// Package store owns ramify's metadata: the sandbox records, kept in an embedded SQLite database (pure-Go
// driver, no cgo) in the data directory so that listings and lookups survive a server restart.
package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	_ "modernc.org/sqlite" // registers the "sqlite" driver

	"github.com/ramify-dev/ramify/internal/errdefs"
)

// Record is one sandbox as persisted.
type Record struct {
	ID         string          `json:"id"`
	Status     string          `json:"status"`
	Error      string          `json:"error"`
	FamilyID   string          `json:"family_id"`
	ParentID   string          `json:"parent_id"`
	ForkedFrom string          `json:"forked_from"`
	IP         string          `json:"ip"`
	Hostname   string          `json:"hostname"`
	CreatedAt  time.Time       `json:"created_at"`
	Spec       json.RawMessage `json:"spec"`     // the create request, normalised
	Handle     json.RawMessage `json:"handle"`   // the runtime's handle, when running
	Snapshot   string          `json:"snapshot"` // key prefix of the pause snapshot, when paused
	Pause      json.RawMessage `json:"pause"`    // what the last pause/resume reported
}

// Store is the database.
type Store struct {
	db *sql.DB
}

const schema = `
CREATE TABLE IF NOT EXISTS sandboxes (
	id          TEXT PRIMARY KEY,
	status      TEXT NOT NULL,
	error       TEXT NOT NULL DEFAULT '',
	family_id   TEXT NOT NULL DEFAULT '',
	parent_id   TEXT NOT NULL DEFAULT '',
	forked_from TEXT NOT NULL DEFAULT '',
	ip          TEXT NOT NULL DEFAULT '',
	hostname    TEXT NOT NULL DEFAULT '',
	created_at  TEXT NOT NULL,
	spec        TEXT NOT NULL DEFAULT '{}',
	handle      TEXT NOT NULL DEFAULT '{}',
	snapshot    TEXT NOT NULL DEFAULT '',
	pause       TEXT NOT NULL DEFAULT '{}'
);
CREATE INDEX IF NOT EXISTS sandboxes_family ON sandboxes(family_id);
`

// Open opens (creating if needed) the database in dir.
func Open(dir string) (*Store, error) {
	path := filepath.Join(dir, "ramify.db")
	db, err := sql.Open("sqlite", "file:"+path+"?_pragma=journal_mode(WAL)&_pragma=busy_timeout(5000)&_pragma=synchronous(NORMAL)&_pragma=foreign_keys(1)")
	if err != nil {
		return nil, fmt.Errorf("open %s: %w", path, err)
	}
	db.SetMaxOpenConns(1) // SQLite writes serialise anyway; one connection avoids SQLITE_BUSY between our own
	if _, err := db.Exec(schema + retiredSchema + templateSchema); err != nil {
		db.Close()
		return nil, fmt.Errorf("init schema in %s: %w", path, err)
	}
	// Columns added after the first release: add them to databases made before.
	for _, col := range []string{"snapshot TEXT NOT NULL DEFAULT ''", "pause TEXT NOT NULL DEFAULT '{}'"} {
		if _, err := db.Exec("ALTER TABLE sandboxes ADD COLUMN " + col); err != nil && !strings.Contains(err.Error(), "duplicate column") {
			db.Close()
			return nil, fmt.Errorf("migrate schema in %s: %w", path, err)
		}
	}
	return &Store{db: db}, nil
}

// Close closes the database.
func (s *Store) Close() error { return s.db.Close() }

const cols = `id, status, error, family_id, parent_id, forked_from, ip, hostname, created_at, spec, handle, snapshot, pause`

func scan(row interface{ Scan(...any) error }) (Record, error) {
	var r Record
	var created, spec, handle, pause string
	err := row.Scan(&r.ID, &r.Status, &r.Error, &r.FamilyID, &r.ParentID, &r.ForkedFrom, &r.IP, &r.Hostname, &created, &spec, &handle, &r.Snapshot, &pause)
	if err != nil {
		return r, err
	}
	r.CreatedAt, _ = time.Parse(time.RFC3339Nano, created)
	r.Spec, r.Handle, r.Pause = json.RawMessage(spec), json.RawMessage(handle), json.RawMessage(pause)
	return r, nil
}

func orEmpty(m json.RawMessage) string {
	if len(m) == 0 {
		return "{}"
	}
	return string(m)
}

func args(r Record) []any {
	return []any{r.ID, r.Status, r.Error, r.FamilyID, r.ParentID, r.ForkedFrom, r.IP, r.Hostname,
		r.CreatedAt.UTC().Format(time.RFC3339Nano), orEmpty(r.Spec), orEmpty(r.Handle), r.Snapshot, orEmpty(r.Pause)}
}

// Put inserts or replaces a record.
func (s *Store) Put(ctx context.Context, r Record) error {
	_, err := s.db.ExecContext(ctx, `INSERT OR REPLACE INTO sandboxes (`+cols+`) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)`, args(r)...)
	if err != nil {
		return fmt.Errorf("save sandbox %s: %w", r.ID, err)
	}
	return nil
}

// PutMany writes several records in one transaction: all or none.
func (s *Store) PutMany(ctx context.Context, rs []Record, deleteIDs []string) error {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback() //nolint:errcheck // after Commit it is a no-op
	for _, r := range rs {
		if _, err := tx.ExecContext(ctx, `INSERT OR REPLACE INTO sandboxes (`+cols+`) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)`, args(r)...); err != nil {
			return fmt.Errorf("save sandbox %s: %w", r.ID, err)
		}
	}
	for _, id := range deleteIDs {
		if _, err := tx.ExecContext(ctx, `DELETE FROM sandboxes WHERE id = ?`, id); err != nil {
			return fmt.Errorf("delete sandbox %s: %w", id, err)
		}
	}
	return tx.Commit()
}

// Get returns one record; errdefs.ErrNotFound if absent.
func (s *Store) Get(ctx context.Context, id string) (Record, error) {
	r, err := scan(s.db.QueryRowContext(ctx, `SELECT `+cols+` FROM sandboxes WHERE id = ?`, id))
	if errors.Is(err, sql.ErrNoRows) {
		return r, fmt.Errorf("sandbox %s: %w", id, errdefs.ErrNotFound)
	}
	return r, err
}

// List returns all records, oldest first.
func (s *Store) List(ctx context.Context) ([]Record, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT `+cols+` FROM sandboxes ORDER BY created_at, id`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []Record
	for rows.Next() {
		r, err := scan(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, r)
	}
	return out, rows.Err()
}

// Delete removes a record; deleting an absent record is not an error.
func (s *Store) Delete(ctx context.Context, id string) error {
	_, err := s.db.ExecContext(ctx, `DELETE FROM sandboxes WHERE id = ?`, id)
	if err != nil {
		return fmt.Errorf("delete sandbox %s: %w", id, err)
	}
	return nil
}
