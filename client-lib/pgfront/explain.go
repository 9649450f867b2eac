package pgfront

import (
	"bytes"
	"context"
	"fmt"
	"regexp"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
	"github.com/jackc/pgx/v5/pgtype"
)

// Larder's own statements, answered by the front in any transaction state
// (simple query protocol, alone in their query string), in the spirit of
// ReadySet's SHOW CACHES and EXPLAIN:
//
//	EXPLAIN LARDER <statement>  what Larder does with the statement: cached
//	                            or why not, its template, tags and tag
//	                            column sets, clock bucket, and this front's
//	                            reads of its template by source
//	SHOW LARDER QUERIES         the templates this front has read, with their
//	                            reads by source and hit rate

var (
	explainLarder = regexp.MustCompile(`(?is)^\s*EXPLAIN\s+LARDER\s+(.+?)\s*;?\s*$`)
	showQueries   = regexp.MustCompile(`(?is)^\s*SHOW\s+LARDER\s+(QUERIES|CACHES)\s*;?\s*$`)
)

// codeSyntaxError is PostgreSQL's syntax_error.
const codeSyntaxError = "42601"

// larderStatement answers EXPLAIN LARDER and SHOW LARDER QUERIES; false
// for any other query string.
func (s *session) larderStatement(ctx context.Context, sql string) bool {
	var answer func() error
	if m := explainLarder.FindStringSubmatch(sql); m != nil {
		answer = func() error { return s.explainLarder(m[1]) }
	} else if showQueries.MatchString(sql) {
		answer = s.showLarderQueries
	} else {
		return false
	}
	if s.ltx == nil {
		// Earlier relayed statements answer first.
		if _, err := s.waitQuiet(); err != nil {
			return true
		}
	}
	if err := answer(); err != nil {
		s.cw.send(errorResponse(err))
	}
	s.readyForQuery()
	return true
}

// textColumns describe columns of text, as PostgreSQL describes EXPLAIN's
// and SHOW's.
func textColumns(names ...string) *pgproto3.RowDescription {
	fields := make([]pgconn.FieldDescription, len(names))
	for i, n := range names {
		fields[i] = pgconn.FieldDescription{Name: n, DataTypeOID: pgtype.TextOID, DataTypeSize: -1, TypeModifier: -1}
	}
	return rowDescription(fields, nil)
}

func (s *session) explainLarder(stmt string) error {
	rep, err := s.sc.Explain(stmt)
	if err != nil {
		return &frontError{severity: "ERROR", code: codeSyntaxError, message: err.Error()}
	}
	var b bytes.Buffer
	if err := rep.WriteText(&b); err != nil {
		return err
	}
	lines := strings.Split(strings.TrimRight(b.String(), "\n"), "\n")
	for _, f := range s.f.cfg.Client.Templates() {
		if f.Template == rep.Template {
			lines = append(lines, fmt.Sprintf("Reads through this front: %d from the L1, %d from a cache-node, %d from PostgreSQL and cached, %d uncached (hit rate %s)",
				f.Reads["l1"], f.Reads["node"], f.Reads["database"]+f.Reads["patched"], f.Reads["uncached"], hitRate(f.Reads)))
		}
	}
	s.cw.send(textColumns("LARDER PLAN"))
	for _, l := range lines {
		s.cw.send(&pgproto3.DataRow{Values: [][]byte{[]byte(l)}})
	}
	s.cw.send(&pgproto3.CommandComplete{CommandTag: []byte("EXPLAIN")})
	return nil
}

func (s *session) showLarderQueries() error {
	s.cw.send(textColumns("template", "query", "l1", "node", "database", "uncached", "hit_rate"))
	n := 0
	for _, f := range s.f.cfg.Client.Templates() {
		s.cw.send(&pgproto3.DataRow{Values: [][]byte{[]byte(f.Template), []byte(f.SQL),
			[]byte(fmt.Sprint(f.Reads["l1"])), []byte(fmt.Sprint(f.Reads["node"])), []byte(fmt.Sprint(f.Reads["database"] + f.Reads["patched"])),
			[]byte(fmt.Sprint(f.Reads["uncached"])), []byte(hitRate(f.Reads))}})
		n++
	}
	s.cw.send(&pgproto3.CommandComplete{CommandTag: []byte(fmt.Sprintf("SELECT %d", n))})
	return nil
}

// hitRate is the share of reads served from the L1 or a cache-node (a
// patched read is a miss: it read rows on PostgreSQL).
func hitRate(r map[string]int64) string {
	total := r["l1"] + r["node"] + r["database"] + r["patched"] + r["uncached"]
	if total == 0 {
		return "-"
	}
	return fmt.Sprintf("%.1f%%", 100*float64(r["l1"]+r["node"])/float64(total))
}
