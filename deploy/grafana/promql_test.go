package grafana

import (
	"fmt"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// selector is one metric a PromQL expression selects, with the job
// variable its job matcher names ("node_job" for job=~"$node_job"; "" when
// it has none).
type selector struct {
	Metric string
	JobVar string
}

// promqlKeywords are identifiers that are not metric names. Those in
// labelLists are followed by a parenthesized list of label names.
var (
	promqlKeywords = []string{"bool", "and", "or", "unless", "offset", "atan2", "inf", "nan"}
	labelLists     = []string{"by", "without", "on", "ignoring", "group_left", "group_right"}
	jobMatcher     = regexp.MustCompile(`(?:^|[{,\s])job\s*=~?\s*"\$\{?([A-Za-z_][A-Za-z0-9_]*)\}?"`)
)

// selectors returns the metric selectors of a PromQL expression. It is a
// lexer, not a parser: it skips strings, durations, numbers, Grafana
// variables, label lists of by/without/on/ignoring/group_*, and function
// and aggregation names (identifiers followed by "(", by or without); every other
// identifier is a metric name, and the {...} after it its matchers.
func selectors(expr string) ([]selector, error) {
	var out []selector
	i, n := 0, len(expr)
	peek := func(j int) (int, byte) { // the next non-space byte from j
		for j < n && strings.ContainsRune(" \t\r\n", rune(expr[j])) {
			j++
		}
		if j < n {
			return j, expr[j]
		}
		return j, 0
	}
	for i < n {
		c := expr[i]
		switch {
		case c == '"' || c == '\'' || c == '`':
			j, err := skipString(expr, i)
			if err != nil {
				return nil, err
			}
			i = j
		case c == '[':
			j := strings.IndexByte(expr[i:], ']')
			if j < 0 {
				return nil, fmt.Errorf("unclosed [ at %d", i)
			}
			i += j + 1
		case c == '{':
			return nil, fmt.Errorf("a selector without a metric name at %d (not checkable)", i)
		case c == '$':
			i++
			if i < n && expr[i] == '{' {
				j := strings.IndexByte(expr[i:], '}')
				if j < 0 {
					return nil, fmt.Errorf("unclosed ${ at %d", i)
				}
				i += j + 1
			} else {
				for i < n && isIdent(expr[i], false) {
					i++
				}
			}
		case c >= '0' && c <= '9' || c == '.':
			for i < n && (isIdent(expr[i], false) || expr[i] == '.') {
				i++
			}
		case isIdent(c, true):
			j := i
			for j < n && isIdent(expr[j], false) {
				j++
			}
			word := expr[i:j]
			k, next := peek(j)
			i = j
			switch {
			case slices.Contains(labelLists, word):
				if next == '(' {
					e := strings.IndexByte(expr[k:], ')')
					if e < 0 {
						return nil, fmt.Errorf("unclosed label list after %s", word)
					}
					i = k + e + 1
				}
			case slices.Contains(promqlKeywords, strings.ToLower(word)):
			case next == '(' || startsWord(expr[k:], "by") || startsWord(expr[k:], "without"):
				// a function, or an aggregation (its by/without may
				// come before its parentheses)
			default:
				s := selector{Metric: word}
				if next == '{' {
					e, err := closeBrace(expr, k)
					if err != nil {
						return nil, err
					}
					if m := jobMatcher.FindStringSubmatch(expr[k:e]); m != nil {
						s.JobVar = m[1]
					}
					i = e
				}
				out = append(out, s)
			}
		default:
			i++
		}
	}
	return out, nil
}

// startsWord reports whether s starts with the identifier w.
func startsWord(s, w string) bool {
	return strings.HasPrefix(s, w) && (len(s) == len(w) || !isIdent(s[len(w)], false))
}

func isIdent(c byte, first bool) bool {
	return c == '_' || c == ':' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || !first && c >= '0' && c <= '9'
}

// skipString returns the index after the string literal starting at i.
func skipString(s string, i int) (int, error) {
	q := s[i]
	for j := i + 1; j < len(s); j++ {
		switch {
		case s[j] == '\\' && q != '`':
			j++
		case s[j] == q:
			return j + 1, nil
		}
	}
	return 0, fmt.Errorf("unclosed string at %d", i)
}

// closeBrace returns the index after the } closing the { at i.
func closeBrace(s string, i int) (int, error) {
	for j := i + 1; j < len(s); {
		switch s[j] {
		case '"', '\'', '`':
			e, err := skipString(s, j)
			if err != nil {
				return 0, err
			}
			j = e
		case '}':
			return j + 1, nil
		default:
			j++
		}
	}
	return 0, fmt.Errorf("unclosed { at %d", i)
}

func TestSelectors(t *testing.T) {
	cases := []struct {
		expr string
		want []selector
	}{
		{`rate(larder_node_lookups_total{job=~"$node_job",result!="hit"}[$__rate_interval])`,
			[]selector{{"larder_node_lookups_total", "node_job"}}},
		{`sum by (template, result) (rate(x_total{result="a}b",job="${client_job}"}[5m] offset 1h)) / ignoring(le) group_left(foo) y`,
			[]selector{{"x_total", "client_job"}, {"y", ""}}},
		{`histogram_quantile(0.99, sum without (instance) (rate(lat_seconds_bucket{job=~"$invalidator_job"}[1m]))) > bool 0.5 and on() vector(1)`,
			[]selector{{"lat_seconds_bucket", "invalidator_job"}}},
		{`topk(10, label_replace(a:b:c, "dst", "$1", "src", "(.*)")) * 1e3 unless up`,
			[]selector{{"a:b:c", ""}, {"up", ""}}},
		{`scalar(sum(m)) @ start()`, []selector{{"m", ""}}},
	}
	for _, c := range cases {
		got, err := selectors(c.expr)
		if err != nil {
			t.Errorf("%s: %v", c.expr, err)
			continue
		}
		if !slices.Equal(got, c.want) {
			t.Errorf("%s:\n got %v\nwant %v", c.expr, got, c.want)
		}
	}
	for _, bad := range []string{`{__name__="x"}`, `rate(x{job="a"[5m])`, `x{a="b}`} {
		if _, err := selectors(bad); err == nil {
			t.Errorf("%s: no error", bad)
		}
	}
}
