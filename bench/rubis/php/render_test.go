package php

import (
	"bytes"
	"encoding/base64"
	"encoding/json"
	"html/template"
	"math"
	"math/rand"
	"net/http/httptest"
	"os/exec"
	"strconv"
	"strings"
	"testing"
)

// The PHP application renders values, quotes parameters, reads numbers and
// form fields as the Go application does (pgx's values through app.go's
// render, strconv, html/template, net/http), case by case.
func TestRenderingMatchesGo(t *testing.T) {
	php := requirePHP(t)
	r := rand.New(rand.NewSource(1))
	type valueCase struct {
		text string
		oid  int
		want string
	}
	var values []valueCase
	// Reals as PostgreSQL prints them (shortest round trip), read by pgx as
	// float32 and rendered with two decimals.
	for i := 0; i < 3000; i++ {
		var f float32
		switch i % 3 {
		case 0:
			f = float32(r.Intn(1_000_000)) / 1000 // prices with three decimals: many halfway cases
		case 1:
			f = float32(r.NormFloat64() * 1e4)
		default:
			f = math.Float32frombits(r.Uint32())
			if math.IsNaN(float64(f)) || math.IsInf(float64(f), 0) {
				continue
			}
		}
		values = append(values, valueCase{pgFloat4(f), 700, strconv.FormatFloat(float64(f), 'f', 2, 64)})
	}
	for i := 0; i < 1000; i++ {
		f := r.NormFloat64() * math.Pow(10, float64(r.Intn(12)-4))
		values = append(values, valueCase{strconv.FormatFloat(f, 'g', -1, 64), 701, strconv.FormatFloat(f, 'f', 2, 64)})
	}
	for _, v := range []struct {
		text string
		oid  int
		want string
	}{
		{"NaN", 700, "NaN"}, {"Infinity", 700, "+Inf"}, {"-Infinity", 701, "-Inf"}, {"-0", 700, "-0.00"}, {"1e+06", 700, "1000000.00"},
		{"2026-11-24 08:17:04.123456", 1114, "2026-11-24 08:17:04"}, {"2026-11-24 08:17:04", 1114, "2026-11-24 08:17:04"},
		{"2026-11-24 10:17:04.5+02", 1184, "2026-11-24 08:17:04"}, {"2026-11-24", 1082, "2026-11-24 00:00:00"},
		{"t", 16, "true"}, {"f", 16, "false"}, {"42", 23, "42"}, {"-9223372036854775808", 20, "-9223372036854775808"},
		{"text <b>", 25, "text <b>"}, {"12.50", 1700, "12.50"},
	} {
		values = append(values, valueCase{v.text, v.oid, v.want})
	}

	quotes := []string{"", "x", `a"b\c`, "tab\there\nnl", "\x00\x7f\x1b", "é ü 😀", "\xff\xfe", "nbsp\u00a0", "\u2028", "é\xc3"}
	atois := []string{"", "0", "-0", "+7", "007", "-12", "12a", " 1", "1 ", "9223372036854775807", "9223372036854775808",
		"-9223372036854775808", "-9223372036854775809", "1_000", "0x10", "+", "-"}
	floats := []string{"", "1", "1.5", "-2.25", "+.5", "1.", ".", "1e3", "1E-2", "1e400", "-1e400", "1e-400", "inf", "-Inf",
		"infinity", "NaN", "nan", "1_0", "1__0", "_1", "1_", "1_.5", "1.5_5", "1e1_0", "0x1p-2", " 1", "12.345", "abc", "-0.001"}
	htmls := []string{"plain", `<a href="x">'&'+</a>`, "nul\x00byte", "é\xffz"}
	forms := [][3]string{
		{"a=1&a=2", "", "a"}, {"a=1", "a=3", "a"}, {"b=%zz&b=2", "", "b"}, {"c=x;y&c=z", "", "c"}, {"d=a+b%20c", "", "d"},
		{"e", "", "e"}, {"=1&f=2", "", "f"}, {"", "g=%41%42", "g"}, {"h=%E2%82%AC", "", "h"},
	}

	in := map[string]any{"values": [][2]any{}, "quote": []string{}, "atoi": atois, "float": floats, "html": []string{}, "form": forms}
	for _, v := range values {
		in["values"] = append(in["values"].([][2]any), [2]any{v.text, v.oid})
	}
	for _, s := range quotes {
		in["quote"] = append(in["quote"].([]string), base64.StdEncoding.EncodeToString([]byte(s)))
	}
	for _, s := range htmls {
		in["html"] = append(in["html"].([]string), base64.StdEncoding.EncodeToString([]byte(s)))
	}
	body, err := json.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(php, "testdata/render.php")
	cmd.Stdin = bytes.NewReader(body)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("php testdata/render.php: %v\n%s\n%s", err, stderr.String(), out)
	}
	var got struct {
		Values []string  `json:"values"`
		Quote  []string  `json:"quote"`
		Atoi   []*int64  `json:"atoi"`
		Float  []*string `json:"float"`
		HTML   []string  `json:"html"`
		Form   []string  `json:"form"`
	}
	if err := json.Unmarshal(out, &got); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	bad := 0
	for i, v := range values {
		if got.Values[i] != v.want {
			if bad++; bad <= 10 {
				t.Errorf("value %q (type %d): PHP %q, Go %q", v.text, v.oid, got.Values[i], v.want)
			}
		}
	}
	for i, s := range quotes {
		if want := strconv.Quote(s); got.Quote[i] != want {
			t.Errorf("quote %q: PHP %s, Go %s", s, got.Quote[i], want)
		}
	}
	for i, s := range atois {
		n, err := strconv.Atoi(s)
		switch {
		case err != nil && got.Atoi[i] != nil:
			t.Errorf("atoi %q: PHP %d, Go %v", s, *got.Atoi[i], err)
		case err == nil && (got.Atoi[i] == nil || *got.Atoi[i] != int64(n)):
			t.Errorf("atoi %q: PHP %v, Go %d", s, got.Atoi[i], n)
		}
	}
	for i, s := range floats {
		f, err := strconv.ParseFloat(s, 64)
		hex := strings.Contains(strings.ToLower(s), "0x") // not read by the PHP application (README)
		switch {
		case hex:
		case err != nil && got.Float[i] != nil:
			t.Errorf("float %q: PHP %s, Go %v", s, *got.Float[i], err)
		case err == nil && (got.Float[i] == nil || *got.Float[i] != strconv.FormatFloat(f, 'f', 2, 64)):
			t.Errorf("float %q: PHP %v, Go %s", s, got.Float[i], strconv.FormatFloat(f, 'f', 2, 64))
		}
	}
	tmpl := template.Must(template.New("").Parse(`{{.}}`))
	for i, s := range htmls {
		var b bytes.Buffer
		if err := tmpl.Execute(&b, s); err != nil {
			t.Fatal(err)
		}
		if php, _ := base64.StdEncoding.DecodeString(got.HTML[i]); string(php) != b.String() {
			t.Errorf("html %q: PHP %q, Go %q", s, php, b.String())
		}
	}
	for i, f := range forms {
		req := httptest.NewRequest("POST", "/X?"+f[0], strings.NewReader(f[1]))
		req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		if want := req.FormValue(f[2]); got.Form[i] != want {
			t.Errorf("form %q body %q field %s: PHP %q, Go %q", f[0], f[1], f[2], got.Form[i], want)
		}
	}
}

// pgFloat4 is PostgreSQL's text of a real (extra_float_digits 1: the
// shortest that reads back).
func pgFloat4(f float32) string {
	return strconv.FormatFloat(float64(f), 'g', -1, 32)
}
