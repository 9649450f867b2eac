package bytesize

import "testing"

func TestParse(t *testing.T) {
	for in, want := range map[string]int64{"0": 0, "17": 17, "3MiB": 3 << 20, "2GiB": 2 << 30, "4KiB": 4096, "5B": 5} {
		if got, err := Parse(in); err != nil || got != want {
			t.Errorf("Parse(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "lots", "-1", "1TiB", "9999999999GiB", "MiB"} {
		if got, err := Parse(in); err == nil {
			t.Errorf("Parse(%q) = %d, want an error", in, got)
		}
	}
}
