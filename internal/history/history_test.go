package history

import (
	"strings"
	"testing"
	"time"
)

func TestCheck(t *testing.T) {
	t0 := time.Unix(1000, 0)
	log := &Log{
		Initial: map[int]Row{1: {50, 0}, 2: {50, 0}},
		Commits: []Commit{
			{LSN: 100, Time: t0.Add(1 * time.Second), Rows: map[int]Row{1: {40, 1}, 2: {60, 1}}},
			{LSN: 200, Time: t0.Add(2 * time.Second), Rows: map[int]Row{1: {30, 2}, 2: {70, 2}}},
		},
	}
	ok := []ReadTx{
		{Begin: t0.Add(3 * time.Second), Staleness: 10 * time.Second, Reads: map[int]Row{1: {50, 0}, 2: {50, 0}}},
		{Begin: t0.Add(3 * time.Second), Staleness: time.Second, Reads: map[int]Row{1: {30, 2}, 2: {70, 2}}},
		{Begin: t0.Add(3 * time.Second), Staleness: 2 * time.Second, Reads: map[int]Row{1: {40, 1}}},
	}
	if v := Check(log, ok, 100, 0); len(v) != 0 {
		t.Fatalf("consistent history reported: %v", v)
	}
	bad := []struct {
		tx   ReadTx
		want string
	}{
		{ReadTx{Begin: t0, Staleness: time.Hour, Reads: map[int]Row{1: {50, 0}, 2: {60, 1}}}, "no single snapshot"},
		{ReadTx{Begin: t0.Add(10 * time.Second), Staleness: time.Second, Reads: map[int]Row{1: {40, 1}, 2: {60, 1}}}, "replaced at"},
		{ReadTx{Begin: t0, Staleness: time.Hour, Reads: map[int]Row{1: {41, 1}}}, "read with balance"},
		{ReadTx{Begin: t0, Staleness: time.Hour, Reads: map[int]Row{1: {40, 9}}}, "never committed"},
	}
	for i, c := range bad {
		v := Check(log, []ReadTx{c.tx}, 100, 0)
		if len(v) != 1 || !strings.Contains(v[0].Why, c.want) {
			t.Errorf("case %d: %v, want %q", i, v, c.want)
		}
	}
}
