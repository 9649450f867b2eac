package quma

import (
	"database/sql/driver"
	"encoding/hex"
	"fmt"
	"math"
	"reflect"
	"strconv"
	"strings"
	"unicode/utf8"
)

// canonical returns v in the text form PostgreSQL's output function gives a
// column of type typ (what logical replication reports for a row), or false
// when it cannot be sure of it; the caller then falls back to the table tag.
// maxNameBytes is the most bytes of a name (NAMEDATALEN - 1).
const maxNameBytes = 63

func canonical(typ string, v any) (string, bool) {
	if vr, ok := v.(driver.Valuer); ok {
		dv, err := vr.Value()
		if err != nil {
			return "", false
		}
		v = dv
	}
	if v == nil {
		return "", false
	}
	switch typ {
	case "int2", "int4", "int8", "oid":
		n, ok := toInt(v)
		if !ok || !intFits(typ, n) {
			return "", false
		}
		return strconv.FormatInt(n, 10), true
	case "text", "varchar", "name":
		var s string
		switch x := v.(type) {
		case string:
			s = x
		case []byte:
			s = string(x)
		case int, int8, int16, int32, int64, uint, uint8, uint16, uint32, uint64:
			s = fmt.Sprint(x) // PostgreSQL casts an integer parameter to text this way
		default:
			return "", false
		}
		if !utf8.ValidString(s) || strings.IndexByte(s, 0) >= 0 {
			return "", false
		}
		if typ == "name" && len(s) > maxNameBytes {
			// PostgreSQL truncates a name to 63 bytes, at a character
			// boundary (pg_mbcliplen): the row holds the truncated text.
			n := maxNameBytes
			for n > 0 && !utf8.RuneStart(s[n]) {
				n--
			}
			s = s[:n]
		}
		return s, true
	case "bool":
		switch x := v.(type) {
		case bool:
			if x {
				return "t", true
			}
			return "f", true
		case string:
			return boolText(x)
		}
		return "", false
	case "uuid":
		switch x := v.(type) {
		case string:
			return uuidText(x)
		case [16]byte:
			return formatUUID(x[:]), true
		case []byte:
			if len(x) == 16 {
				return formatUUID(x), true
			}
			return uuidText(string(x))
		}
		return "", false
	}
	return "", false
}

func toInt(v any) (int64, bool) {
	switch x := v.(type) {
	case int:
		return int64(x), true
	case int8:
		return int64(x), true
	case int16:
		return int64(x), true
	case int32:
		return int64(x), true
	case int64:
		return x, true
	case uint8:
		return int64(x), true
	case uint16:
		return int64(x), true
	case uint32:
		return int64(x), true
	case uint:
		if uint64(x) > math.MaxInt64 {
			return 0, false
		}
		return int64(x), true
	case uint64:
		if x > math.MaxInt64 {
			return 0, false
		}
		return int64(x), true
	case float64:
		if x != math.Trunc(x) || math.Abs(x) > 1<<53 {
			return 0, false
		}
		return int64(x), true
	case float32:
		return toInt(float64(x))
	case string:
		// int4in accepts surrounding whitespace and a sign; "042" is 42.
		n, err := strconv.ParseInt(strings.TrimSpace(x), 10, 64)
		return n, err == nil
	case []byte:
		return toInt(string(x))
	}
	return 0, false
}

func intFits(typ string, n int64) bool {
	switch typ {
	case "int2":
		return n >= math.MinInt16 && n <= math.MaxInt16
	case "int4":
		return n >= math.MinInt32 && n <= math.MaxInt32
	case "oid":
		return n >= 0 && n <= math.MaxUint32
	}
	return true
}

// boolText accepts the spellings boolin accepts.
func boolText(s string) (string, bool) {
	switch strings.ToLower(strings.TrimSpace(s)) {
	case "t", "tr", "tru", "true", "y", "ye", "yes", "on", "1":
		return "t", true
	case "f", "fa", "fal", "fals", "false", "n", "no", "of", "off", "0":
		return "f", true
	}
	return "", false
}

// uuidText accepts the spellings uuid_in accepts and returns the canonical one.
func uuidText(s string) (string, bool) {
	s = strings.TrimSpace(s)
	if strings.HasPrefix(s, "{") && strings.HasSuffix(s, "}") {
		s = s[1 : len(s)-1]
	}
	h := strings.ReplaceAll(s, "-", "")
	if len(h) != 32 {
		return "", false
	}
	b, err := hex.DecodeString(h)
	if err != nil {
		return "", false
	}
	return formatUUID(b), true
}

func formatUUID(b []byte) string {
	h := hex.EncodeToString(b)
	return h[0:8] + "-" + h[8:12] + "-" + h[12:16] + "-" + h[16:20] + "-" + h[20:32]
}

// arrayElems returns the elements of a slice or array parameter (for col = ANY($n)).
func arrayElems(v any) ([]any, bool) {
	if v == nil {
		return nil, false
	}
	if _, isBytes := v.([]byte); isBytes {
		return nil, false
	}
	rv := reflect.ValueOf(v)
	if rv.Kind() != reflect.Slice && rv.Kind() != reflect.Array {
		return nil, false
	}
	out := make([]any, rv.Len())
	for i := range out {
		out[i] = rv.Index(i).Interface()
	}
	return out, true
}
