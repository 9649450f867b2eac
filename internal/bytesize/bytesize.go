// Package bytesize reads the byte counts of flags and DSN parameters:
// a number with an optional B, KiB, MiB or GiB suffix.
package bytesize

import (
	"fmt"
	"strconv"
	"strings"
)

// Parse reads s ("64MiB", "1048576"). Negative counts and counts that
// overflow are errors.
func Parse(s string) (int64, error) {
	in := s
	mult := int64(1)
	for _, u := range []struct {
		suffix string
		m      int64
	}{{"GiB", 1 << 30}, {"MiB", 1 << 20}, {"KiB", 1 << 10}, {"B", 1}} {
		if strings.HasSuffix(s, u.suffix) {
			s, mult = strings.TrimSuffix(s, u.suffix), u.m
			break
		}
	}
	n, err := strconv.ParseInt(strings.TrimSpace(s), 10, 64)
	if err != nil || n < 0 || n > (1<<62)/mult {
		return 0, fmt.Errorf("%q is not a byte count (a number with an optional KiB, MiB or GiB suffix)", in)
	}
	return n * mult, nil
}
