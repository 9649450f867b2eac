package quma

import (
	"bufio"
	"bytes"
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"sort"
	"strconv"
	"strings"

	pg "github.com/pganalyze/pg_query_go/v6"
)

// Statement is one statement of a workload: a template with `$n`
// parameters, how often the application runs it, and where it was found.
type Statement struct {
	SQL       string
	Frequency int64
	Source    string // "file:line" of its first occurrence
}

// maxWorkloadInput bounds what one workload reader accepts, so that a wrong
// file (a binary, a core dump) fails clearly instead of exhausting memory.
const maxWorkloadInput = 1 << 30

// MaxStatementBytes bounds one statement: PostgreSQL's parser, through
// pg_query, needs about 150 times a statement's size in memory, so a
// 10 MB statement (a generated INSERT, say) would take gigabytes. A
// template file's statement over it is an error; a logged one is skipped
// with a warning.
const MaxStatementBytes = 256 << 10

// MaxTemplateFile bounds a template file (hand-written templates are
// small; the whole file is tokenized at once).
const MaxTemplateFile = 8 << 20

// ReadTemplates reads a file of SQL templates: statements separated by `;`,
// with `$n` or `?` parameters (a statement uses one style or the other).
// Comments are dropped. `??` stands for PostgreSQL's own `?` operator (as in
// JDBC). Each statement counts once; a template that appears several times
// (same fingerprint) is merged and its frequency added up. A statement
// PostgreSQL's parser rejects is a *SyntaxError naming the file and line.
func ReadTemplates(r io.Reader, name string) ([]Statement, error) {
	text, err := readAllLimitedTo(r, name, MaxTemplateFile)
	if err != nil {
		return nil, err
	}
	// A cheap split first: an oversized statement is refused before the
	// whole file is tokenized (which costs far more memory).
	if parts, err := pg.SplitWithScanner(text, true); err == nil {
		off := 0
		for _, p := range parts {
			at := strings.Index(text[off:], p)
			if at >= 0 {
				at += off
				off = at + len(p)
			}
			if len(p) > MaxStatementBytes {
				return nil, fmt.Errorf("%s:%d: a statement of %d bytes: templates are limited to %d bytes each", name, lineOf(text, max(at, 0)), len(p), MaxStatementBytes)
			}
		}
	}
	scan, err := pg.Scan(text)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", name, newSyntaxError(text, err))
	}
	m := newMerger()
	var (
		b        strings.Builder // the statement on one line
		lines    strings.Builder // the same with its line breaks, for error positions
		start    = -1            // byte offset of the statement's first token
		last     int             // end of the last token copied
		nextQ    int             // next `?` parameter number
		dollar   bool            // the statement uses $n
		firstQ   = -1            // offset of its first `?`
		flushErr error
	)
	flush := func() {
		if start < 0 || flushErr != nil {
			return
		}
		sql := strings.TrimSpace(b.String())
		src := fmt.Sprintf("%s:%d", name, lineOf(text, start))
		if len(sql) > MaxStatementBytes {
			flushErr = fmt.Errorf("%s: a statement of %d bytes: templates are limited to %d bytes each", src, len(sql), MaxStatementBytes)
			return
		}
		if dollar && firstQ >= 0 {
			flushErr = fmt.Errorf("%s: mixes $n and ? parameters", src)
			return
		}
		if _, perr := pg.Parse(lines.String()); perr != nil {
			se := newSyntaxError(lines.String(), perr)
			var s *SyntaxError
			if errors.As(se, &s) && s.Line > 0 {
				s.Line += lineOf(text, start) - 1
			}
			flushErr = fmt.Errorf("%s: %w", name, se)
			return
		}
		if err := m.add(sql, 1, src); err != nil {
			flushErr = fmt.Errorf("%s: %w", src, err)
		}
		b.Reset()
		lines.Reset()
		start, nextQ, dollar, firstQ = -1, 0, false, -1
	}
	for _, tk := range scan.Tokens {
		switch tk.Token {
		case pg.Token_SQL_COMMENT, pg.Token_C_COMMENT:
			continue
		case pg.Token_ASCII_59: // ;
			flush()
			continue
		}
		s, e := int(tk.Start), int(tk.End)
		if s < 0 || e > len(text) || s > e {
			return nil, fmt.Errorf("%s: scanner returned a bad token position", name)
		}
		if start < 0 {
			start = s
		} else if s > last {
			// The gap held whitespace or comments.
			b.WriteByte(' ')
			if nl := strings.Count(text[last:s], "\n"); nl > 0 {
				lines.WriteString(strings.Repeat("\n", nl))
			} else {
				lines.WriteByte(' ')
			}
		}
		last = e
		tok := text[s:e]
		switch {
		case tk.Token == pg.Token_PARAM:
			dollar = true
		case tk.Token == pg.Token_Op && strings.HasSuffix(tok, "??"):
			tok = tok[:len(tok)-1] // an escaped ? operator
		case tk.Token == pg.Token_Op && strings.HasSuffix(tok, "?"):
			if firstQ < 0 {
				firstQ = s
			}
			nextQ++
			param := "$" + strconv.Itoa(nextQ)
			if op := tok[:len(tok)-1]; op != "" {
				param = op + " " + param // "=?" is "=" then a parameter
			}
			tok = param
		}
		b.WriteString(tok)
		lines.WriteString(tok)
	}
	flush()
	if flushErr != nil {
		return nil, flushErr
	}
	if len(m.stmts) == 0 {
		return nil, fmt.Errorf("%s: %w", name, ErrNoTemplates)
	}
	return m.result(), nil
}

// ErrNoTemplates is the error of a template file without a statement
// (empty, or comments only): analyzing it would cache nothing.
var ErrNoTemplates = errors.New("holds no SQL statement (a template file lists the application's statements, separated by ';')")

// ReadServerLog reads a PostgreSQL server log written with
// log_statement=all (or log_min_duration_statement=0): the stderr format,
// whatever its log_line_prefix, or csvlog (recognised by its first record).
// It extracts simple-query `statement:` lines and extended-protocol
// `execute` lines, replaces literals by parameters, and counts each
// template. Entries it cannot parse are skipped with a warning each (the
// first few; then a count); transaction control and other utility
// statements are counted in one warning.
func ReadServerLog(r io.Reader, name string) ([]Statement, []string, error) {
	br := bufio.NewReaderSize(io.LimitReader(r, maxWorkloadInput+1), 64<<10)
	head, _ := br.Peek(4096)
	ext := newLogExtractor(name)
	var err error
	if looksLikeCSVLog(head) {
		err = ext.readCSV(br)
	} else {
		err = ext.readStderr(br)
	}
	if err != nil {
		return nil, nil, err
	}
	return ext.m.result(), ext.warnings(), nil
}

// ReadPGSS reads a pg_stat_statements export: CSV (psql's \copy … csv
// header) or tab-separated text (COPY's text format, with a header line),
// with at least a `query` column and usually `calls`. Rows whose query does
// not parse (pg_stat_statements truncates long ones) are skipped with a
// warning.
func ReadPGSS(r io.Reader, name string) ([]Statement, []string, error) {
	text, err := readAllLimited(r, name)
	if err != nil {
		return nil, nil, err
	}
	firstLine, _, _ := strings.Cut(text, "\n")
	var rows [][]string
	if strings.Count(firstLine, "\t") > strings.Count(firstLine, ",") {
		rows, err = readCopyText(text)
	} else {
		cr := csv.NewReader(strings.NewReader(text))
		cr.FieldsPerRecord = -1
		rows, err = cr.ReadAll()
	}
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", name, err)
	}
	if len(rows) == 0 {
		return nil, nil, fmt.Errorf("%s: empty pg_stat_statements export", name)
	}
	qcol, ccol := -1, -1
	for i, h := range rows[0] {
		switch strings.ToLower(strings.TrimSpace(h)) {
		case "query":
			qcol = i
		case "calls":
			ccol = i
		}
	}
	if qcol < 0 {
		return nil, nil, fmt.Errorf("%s: no \"query\" column in the header %q (export with: \\copy (SELECT query, calls FROM pg_stat_statements) TO 'file.csv' CSV HEADER)", name, firstLine)
	}
	var warns []string
	if ccol < 0 {
		warns = append(warns, fmt.Sprintf("%s: no \"calls\" column: every query counts once", name))
	}
	m := newMerger()
	sk := skipper{name: name}
	for i, row := range rows[1:] {
		line := fmt.Sprintf("%s:row %d", name, i+2)
		if qcol >= len(row) {
			sk.bad(line, "short row")
			continue
		}
		calls := int64(1)
		if ccol >= 0 {
			if ccol >= len(row) {
				sk.bad(line, "short row")
				continue
			}
			n, err := strconv.ParseInt(strings.TrimSpace(row[ccol]), 10, 64)
			if err != nil || n < 0 {
				sk.bad(line, fmt.Sprintf("calls %q is not a count", row[ccol]))
				continue
			}
			calls = n
		}
		sk.statements(m, row[qcol], calls, line)
	}
	return m.result(), append(warns, sk.warnings()...), nil
}

// merger collects statements by fingerprint.
type merger struct {
	byFP  map[string]int
	stmts []Statement
}

func newMerger() *merger { return &merger{byFP: map[string]int{}} }

func (m *merger) add(sql string, freq int64, src string) error {
	fp, err := pg.Fingerprint(sql)
	if err != nil {
		return err
	}
	if i, ok := m.byFP[fp]; ok {
		m.stmts[i].Frequency += freq
		return nil
	}
	m.byFP[fp] = len(m.stmts)
	m.stmts = append(m.stmts, Statement{SQL: sql, Frequency: freq, Source: src})
	return nil
}

// result returns the statements, most frequent first, ties in the order
// they were first seen.
func (m *merger) result() []Statement {
	out := append([]Statement(nil), m.stmts...)
	sort.SliceStable(out, func(i, j int) bool { return out[i].Frequency > out[j].Frequency })
	return out
}

// skipper turns logged SQL into templates and keeps the warnings about
// what it skipped.
type skipper struct {
	name    string
	badN    int
	badMsgs []string
	utility int
}

const maxBadWarnings = 10

func (s *skipper) bad(where, why string) {
	s.badN++
	if len(s.badMsgs) < maxBadWarnings {
		s.badMsgs = append(s.badMsgs, fmt.Sprintf("%s: skipped: %s", where, why))
	}
}

// statements normalizes text (which may hold several statements) and adds
// each to m.
func (s *skipper) statements(m *merger, text string, freq int64, where string) {
	if len(text) > 4*MaxStatementBytes {
		s.bad(where, fmt.Sprintf("%d bytes of SQL in one entry (over %d)", len(text), 4*MaxStatementBytes))
		return
	}
	parts, err := pg.SplitWithParser(text, true)
	if err != nil {
		s.bad(where, "does not parse: "+firstLine(err.Error()))
		return
	}
	for _, p := range parts {
		if p == "" {
			continue
		}
		if len(p) > MaxStatementBytes {
			s.bad(where, fmt.Sprintf("a statement of %d bytes (over %d)", len(p), MaxStatementBytes))
			continue
		}
		util, err := pg.IsUtilityStmt(p)
		if err != nil {
			s.bad(where, "does not parse: "+firstLine(err.Error()))
			continue
		}
		if len(util) == 1 && util[0] {
			s.utility++
			continue
		}
		norm, err := pg.Normalize(p)
		if err != nil {
			s.bad(where, "does not normalize: "+firstLine(err.Error()))
			continue
		}
		if err := m.add(norm, freq, where); err != nil {
			s.bad(where, "no fingerprint: "+firstLine(err.Error()))
		}
	}
}

func (s *skipper) warnings() []string {
	w := append([]string(nil), s.badMsgs...)
	if s.badN > len(s.badMsgs) {
		w = append(w, fmt.Sprintf("%s: skipped %d more entries that did not parse", s.name, s.badN-len(s.badMsgs)))
	}
	if s.utility > 0 {
		w = append(w, fmt.Sprintf("%s: skipped %d utility statements (BEGIN, COMMIT, SET, DDL, …)", s.name, s.utility))
	}
	return w
}

// logExtractor pulls statements out of server log messages.
type logExtractor struct {
	skipper
	m *merger
}

func newLogExtractor(name string) *logExtractor {
	return &logExtractor{skipper: skipper{name: name}, m: newMerger()}
}

func (x *logExtractor) warnings() []string {
	w := x.skipper.warnings()
	if len(x.m.stmts) == 0 {
		w = append(w, fmt.Sprintf("%s: no statements found: was the server run with log_statement=all or log_min_duration_statement=0?", x.name))
	}
	return w
}

// message handles one log message (its text after the severity).
func (x *logExtractor) message(msg string, where string) {
	// "duration: 0.123 ms  statement: …" / "duration: 0.1 ms  execute S_1: …"
	if rest, ok := strings.CutPrefix(msg, "duration: "); ok {
		i := strings.Index(rest, "  ")
		if i < 0 {
			return // a bare duration line (log_duration=on) holds no SQL
		}
		msg = strings.TrimLeft(rest[i:], " ")
	}
	switch {
	case strings.HasPrefix(msg, "statement: "):
		x.statements(x.m, msg[len("statement: "):], 1, where)
	case strings.HasPrefix(msg, "execute "):
		// "execute <unnamed>: SELECT …" or "execute S_1: …"; parse and bind
		// lines of the same statement are not counted.
		_, sql, ok := strings.Cut(msg, ": ")
		if !ok {
			x.bad(where, "execute line without SQL")
			return
		}
		x.statements(x.m, sql, 1, where)
	}
}

// readStderr reads the stderr log format: each entry starts with the
// log_line_prefix and a severity ("LOG:  "); continuation lines start with a
// tab.
func (x *logExtractor) readStderr(r io.Reader) error {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 64<<20)
	var (
		cur     strings.Builder
		curLine int
		in      bool
		n       int
	)
	done := func() {
		if in {
			x.message(cur.String(), fmt.Sprintf("%s:%d", x.name, curLine))
		}
		cur.Reset()
		in = false
	}
	for sc.Scan() {
		n++
		line := sc.Text()
		if strings.HasPrefix(line, "\t") {
			if in {
				cur.WriteByte('\n')
				cur.WriteString(line[1:])
			}
			continue
		}
		done()
		if i := strings.Index(line, "LOG:  "); i >= 0 {
			cur.WriteString(line[i+len("LOG:  "):])
			curLine = n
			in = true
		}
	}
	done()
	if err := sc.Err(); err != nil {
		return fmt.Errorf("%s:%d: %w", x.name, n+1, err)
	}
	if n == 0 {
		return fmt.Errorf("%s: empty log", x.name)
	}
	return nil
}

// csvlog columns (PostgreSQL 15): error_severity is the 12th, message the
// 14th.
const (
	csvSeverity = 11
	csvMessage  = 13
)

func looksLikeCSVLog(head []byte) bool {
	cr := csv.NewReader(bytes.NewReader(head))
	cr.FieldsPerRecord = -1
	rec, err := cr.Read()
	if err != nil {
		// The first record may be longer than head: look at the fields
		// before the message, which hold no line breaks.
		line, _, _ := bytes.Cut(head, []byte("\n"))
		rec = strings.SplitN(string(line), ",", csvMessage+1)
	}
	if len(rec) <= csvSeverity {
		return false
	}
	switch rec[csvSeverity] {
	case "LOG", "ERROR", "WARNING", "NOTICE", "INFO", "FATAL", "PANIC", "DEBUG1", "DEBUG2", "DEBUG3", "DEBUG4", "DEBUG5":
		return true
	}
	return false
}

func (x *logExtractor) readCSV(r io.Reader) error {
	cr := csv.NewReader(r)
	cr.FieldsPerRecord = -1
	cr.ReuseRecord = true
	for rec := 1; ; rec++ {
		fields, err := cr.Read()
		if err == io.EOF {
			return nil
		}
		if err != nil {
			return fmt.Errorf("%s: csvlog: %w", x.name, err)
		}
		if len(fields) <= csvMessage {
			line, _ := cr.FieldPos(0)
			x.bad(fmt.Sprintf("%s:%d", x.name, line), fmt.Sprintf("csvlog record with %d fields", len(fields)))
			continue
		}
		if fields[csvSeverity] != "LOG" {
			continue
		}
		line, _ := cr.FieldPos(0)
		x.message(fields[csvMessage], fmt.Sprintf("%s:%d", x.name, line))
	}
}

// readCopyText splits COPY's text format into rows and unescapes fields.
func readCopyText(text string) ([][]string, error) {
	var rows [][]string
	for _, line := range strings.Split(strings.TrimRight(text, "\n"), "\n") {
		line = strings.TrimSuffix(line, "\r")
		fields := strings.Split(line, "\t")
		for i, f := range fields {
			u, err := unescapeCopy(f)
			if err != nil {
				return nil, fmt.Errorf("row %d: %w", len(rows)+1, err)
			}
			fields[i] = u
		}
		rows = append(rows, fields)
	}
	return rows, nil
}

func unescapeCopy(f string) (string, error) {
	if !strings.Contains(f, `\`) {
		return f, nil
	}
	var b strings.Builder
	for i := 0; i < len(f); i++ {
		c := f[i]
		if c != '\\' {
			b.WriteByte(c)
			continue
		}
		i++
		if i >= len(f) {
			return "", errors.New("field ends with a backslash")
		}
		switch f[i] {
		case 'n':
			b.WriteByte('\n')
		case 't':
			b.WriteByte('\t')
		case 'r':
			b.WriteByte('\r')
		case 'b':
			b.WriteByte('\b')
		case 'f':
			b.WriteByte('\f')
		case 'v':
			b.WriteByte('\v')
		default:
			b.WriteByte(f[i])
		}
	}
	return b.String(), nil
}

func readAllLimited(r io.Reader, name string) (string, error) {
	return readAllLimitedTo(r, name, maxWorkloadInput)
}

func readAllLimitedTo(r io.Reader, name string, limit int) (string, error) {
	b, err := io.ReadAll(io.LimitReader(r, int64(limit)+1))
	if err != nil {
		return "", fmt.Errorf("%s: %w", name, err)
	}
	if len(b) > limit {
		return "", fmt.Errorf("%s: larger than %d bytes", name, limit)
	}
	if bytes.IndexByte(b, 0) >= 0 {
		return "", fmt.Errorf("%s: holds a NUL byte: not a text file", name)
	}
	return string(b), nil
}

func lineOf(text string, off int) int {
	return strings.Count(text[:min(off, len(text))], "\n") + 1
}

func firstLine(s string) string {
	l, _, _ := strings.Cut(s, "\n")
	return l
}
