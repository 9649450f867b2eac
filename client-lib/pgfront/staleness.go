package pgfront

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	larder "github.com/larderdb/larder/client-lib"
)

// parseStaleness reads a larder.staleness value: a Go duration ("1m30s"),
// a number with one of PostgreSQL's time units (ms, s, min, h, d; "5s",
// "500 ms", "2min") or a bare number of seconds. It must be positive and
// at most larder.MaxStaleness.
func parseStaleness(v string) (time.Duration, error) {
	v = strings.TrimSpace(v)
	d, err := time.ParseDuration(v)
	if err != nil {
		num := strings.TrimRightFunc(v, func(r rune) bool { return r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' })
		unit := strings.ToLower(v[len(num):])
		num = strings.TrimSpace(num)
		scale, ok := map[string]time.Duration{"": time.Second, "ms": time.Millisecond, "s": time.Second,
			"min": time.Minute, "h": time.Hour, "d": 24 * time.Hour}[unit]
		f, perr := strconv.ParseFloat(num, 64)
		if !ok || perr != nil || num == "" || f != f || f > float64(larder.MaxStaleness/scale)+1 {
			return 0, fmt.Errorf("not a duration")
		}
		d = time.Duration(f * float64(scale))
	}
	if d <= 0 {
		return 0, fmt.Errorf("not positive")
	}
	if d > larder.MaxStaleness {
		return 0, fmt.Errorf("more than %s", formatStaleness(larder.MaxStaleness))
	}
	return d, nil
}

// formatStaleness prints d as PostgreSQL prints a time setting: in the
// largest unit that divides it.
func formatStaleness(d time.Duration) string {
	for _, u := range []struct {
		d    time.Duration
		name string
	}{{24 * time.Hour, "d"}, {time.Hour, "h"}, {time.Minute, "min"}, {time.Second, "s"}, {time.Millisecond, "ms"}} {
		if d%u.d == 0 {
			return strconv.FormatInt(int64(d/u.d), 10) + u.name
		}
	}
	return d.String()
}
