package namespaces

import (
	"testing"
	"time"
)

func TestAdmitAhead(t *testing.T) {
	now := time.Now()
	ago := func(s float64) time.Time { return now.Add(-time.Duration(s * float64(time.Second))) }
	for _, c := range []struct {
		name      string
		held      []time.Time
		k, budget int
		evict     int
		ok        bool
	}{
		{"room", nil, 5, 20, 0, true},
		{"room for the fourth", []time.Time{ago(1), ago(1), ago(1)}, 5, 20, 0, true},
		{"full, oldest held long enough", []time.Time{ago(9), ago(1), ago(1), ago(1)}, 5, 20, 1, true},
		{"full, oldest held too briefly", []time.Time{ago(4), ago(1), ago(1), ago(1)}, 5, 20, 0, false},
		{"one family's worth", []time.Time{ago(6)}, 5, 5, 1, true},
		{"one family's worth, just granted", []time.Time{ago(0.5)}, 5, 5, 0, false},
		{"smaller budget evicts two", []time.Time{ago(30), ago(20), ago(1)}, 5, 12, 2, true},
		{"second oldest too recent", []time.Time{ago(30), ago(2), ago(1)}, 5, 12, 0, false},
		{"no budget", nil, 5, 0, 0, false},
		{"none asked", nil, 0, 20, 0, false},
	} {
		evict, ok := admitAhead(c.held, c.k, c.budget, now)
		if evict != c.evict || ok != c.ok {
			t.Errorf("%s: admitAhead = %d, %v; want %d, %v", c.name, evict, ok, c.evict, c.ok)
		}
	}
}
