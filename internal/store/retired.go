package store

import (
	"context"
	"database/sql"
	"fmt"
	"time"
)

// Retired is a sandbox id that is gone, remembered so that a caller who still holds it learns what became of it
// (a 404 that says "merged into sbx_..." rather than only "not found").
type Retired struct {
	ID         string
	MergedInto string // the parent it was merged into; "" when it was deleted
	Reason     string // for a deletion: why ("deleted", "its timeout expired", ...)
	At         time.Time
}

// MaxRetired bounds the remembered ids: the oldest are forgotten first.
const MaxRetired = 10000

const retiredSchema = `
CREATE TABLE IF NOT EXISTS retired (
	id          TEXT PRIMARY KEY,
	merged_into TEXT NOT NULL DEFAULT '',
	reason      TEXT NOT NULL DEFAULT '',
	at          TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS retired_at ON retired(at);
`

// Merge saves a merge in one transaction: the parent's new record, the winner's record deleted and its id
// remembered as merged into the parent.
func (s *Store) Merge(ctx context.Context, parent Record, winnerID string, at time.Time) error {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback() //nolint:errcheck // after Commit it is a no-op
	if _, err := tx.ExecContext(ctx, `INSERT OR REPLACE INTO sandboxes (`+cols+`) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)`, args(parent)...); err != nil {
		return fmt.Errorf("save sandbox %s: %w", parent.ID, err)
	}
	if _, err := tx.ExecContext(ctx, `DELETE FROM sandboxes WHERE id = ?`, winnerID); err != nil {
		return fmt.Errorf("delete sandbox %s: %w", winnerID, err)
	}
	if err := remember(ctx, tx, Retired{ID: winnerID, MergedInto: parent.ID, At: at}); err != nil {
		return err
	}
	return tx.Commit()
}

// UndoMerge reverts a Merge whose swap failed, in one transaction: both records as they were, the winner's id
// no longer remembered as merged.
func (s *Store) UndoMerge(ctx context.Context, parent, winner Record) error {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback() //nolint:errcheck // after Commit it is a no-op
	for _, r := range []Record{parent, winner} {
		if _, err := tx.ExecContext(ctx, `INSERT OR REPLACE INTO sandboxes (`+cols+`) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)`, args(r)...); err != nil {
			return fmt.Errorf("restore sandbox %s: %w", r.ID, err)
		}
	}
	if _, err := tx.ExecContext(ctx, `DELETE FROM retired WHERE id = ?`, winner.ID); err != nil {
		return fmt.Errorf("forget retired sandbox %s: %w", winner.ID, err)
	}
	return tx.Commit()
}

// Retire deletes a sandbox's record and remembers its id as deleted, for reason.
func (s *Store) Retire(ctx context.Context, id, reason string, at time.Time) error {
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return err
	}
	defer tx.Rollback() //nolint:errcheck
	if _, err := tx.ExecContext(ctx, `DELETE FROM sandboxes WHERE id = ?`, id); err != nil {
		return fmt.Errorf("delete sandbox %s: %w", id, err)
	}
	if err := remember(ctx, tx, Retired{ID: id, Reason: reason, At: at}); err != nil {
		return err
	}
	return tx.Commit()
}

// remember records r and forgets the oldest ids past MaxRetired.
func remember(ctx context.Context, tx *sql.Tx, r Retired) error {
	if _, err := tx.ExecContext(ctx, `INSERT OR REPLACE INTO retired (id, merged_into, reason, at) VALUES (?,?,?,?)`,
		r.ID, r.MergedInto, r.Reason, r.At.UTC().Format(time.RFC3339Nano)); err != nil {
		return fmt.Errorf("remember retired sandbox %s: %w", r.ID, err)
	}
	if _, err := tx.ExecContext(ctx, `DELETE FROM retired WHERE id NOT IN (SELECT id FROM retired ORDER BY at DESC LIMIT ?)`,
		MaxRetired); err != nil {
		return fmt.Errorf("forget old retired sandboxes: %w", err)
	}
	return nil
}

// ListRetired returns the remembered ids, oldest first.
func (s *Store) ListRetired(ctx context.Context) ([]Retired, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT id, merged_into, reason, at FROM retired ORDER BY at, id`)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var out []Retired
	for rows.Next() {
		var r Retired
		var at string
		if err := rows.Scan(&r.ID, &r.MergedInto, &r.Reason, &at); err != nil {
			return nil, err
		}
		r.At, _ = time.Parse(time.RFC3339Nano, at)
		out = append(out, r)
	}
	return out, rows.Err()
}
