package store

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/ramify-dev/ramify/internal/errdefs"
)

func TestStoreRoundTripAndReopen(t *testing.T) {
	dir := t.TempDir()
	ctx := context.Background()
	s, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now().UTC().Truncate(time.Microsecond)
	a := Record{ID: "sbx_a", Status: "running", FamilyID: "fam_a", IP: "10.0.0.2", CreatedAt: now, Spec: json.RawMessage(`{"vcpu":1}`)}
	b := Record{ID: "sbx_b", Status: "running", FamilyID: "fam_a", ParentID: "sbx_a", CreatedAt: now.Add(time.Second)}
	if err := s.Put(ctx, a); err != nil {
		t.Fatal(err)
	}
	if err := s.PutMany(ctx, []Record{b}, nil); err != nil {
		t.Fatal(err)
	}
	s.Close()

	s, err = Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	got, err := s.Get(ctx, "sbx_a")
	if err != nil {
		t.Fatal(err)
	}
	if got.IP != a.IP || !got.CreatedAt.Equal(now) || string(got.Spec) != `{"vcpu":1}` {
		t.Fatalf("got %+v", got)
	}
	list, err := s.List(ctx)
	if err != nil || len(list) != 2 || list[0].ID != "sbx_a" || list[1].ParentID != "sbx_a" {
		t.Fatalf("list = %+v, %v", list, err)
	}
	if err := s.PutMany(ctx, []Record{{ID: "sbx_c", Status: "running", CreatedAt: now}}, []string{"sbx_a"}); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Get(ctx, "sbx_a"); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("deleted record: err = %v, want ErrNotFound", err)
	}
	if err := s.Delete(ctx, "sbx_zzz"); err != nil {
		t.Fatalf("delete absent: %v", err)
	}
}
