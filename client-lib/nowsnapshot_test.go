package larder

import (
	"reflect"
	"testing"

	"github.com/jackc/pgx/v5/pgconn"

	"github.com/larderdb/larder/internal/invalidation"
)

func TestParseNowSnapshot(t *testing.T) {
	answer := func(cols ...string) []*pgconn.Result {
		row := make([][]byte, len(cols))
		for i, c := range cols {
			row[i] = []byte(c)
		}
		return []*pgconn.Result{{}, {Rows: [][][]byte{row}}}
	}
	for _, c := range []struct {
		name    string
		results []*pgconn.Result
		want    invalidation.PinVerifyRequest
		bad     bool
	}{
		{"no transaction in progress", answer("740", "740", "{}", "0/16B3748"), invalidation.PinVerifyRequest{Xmin: 740, Xmax: 740, InsertLSN: 0x16B3748}, false},
		{"in progress", answer("740", "745", "{741,743}", "1/0"), invalidation.PinVerifyRequest{Xmin: 740, Xmax: 745, Xip: []uint64{741, 743}, InsertLSN: 1 << 32}, false},
		{"no answer", []*pgconn.Result{{}}, invalidation.PinVerifyRequest{}, true},
		{"three columns", answer("1", "2", "{}"), invalidation.PinVerifyRequest{}, true},
		{"not a number", answer("x", "2", "{}", "0/1"), invalidation.PinVerifyRequest{}, true},
		{"not an array", answer("1", "2", "3", "0/1"), invalidation.PinVerifyRequest{}, true},
		{"bad element", answer("1", "3", "{2,}", "0/1"), invalidation.PinVerifyRequest{}, true},
		{"bad LSN", answer("1", "2", "{}", "16"), invalidation.PinVerifyRequest{}, true},
	} {
		got, err := parseNowSnapshot(c.results)
		if c.bad {
			if err == nil {
				t.Errorf("%s: no error", c.name)
			}
			continue
		}
		if err != nil || !reflect.DeepEqual(got, c.want) {
			t.Errorf("%s: %+v, %v; want %+v", c.name, got, err, c.want)
		}
	}
}
