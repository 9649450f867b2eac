package pgfront

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"net"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
)

const typesDDL = `CREATE TYPE mood AS ENUM ('sad', 'ok', 'happy');
CREATE DOMAIN posint AS int CHECK (VALUE > 0);
CREATE TABLE accounts (id int PRIMARY KEY, balance int NOT NULL, owner text NOT NULL DEFAULT 'x');
ALTER TABLE accounts REPLICA IDENTITY FULL;
CREATE TABLE typed (id int PRIMARY KEY, u uuid, j json, jb jsonb, ia int4[], ta text[], n numeric, n2 numeric(10,2),
  ts timestamp, tz timestamptz, d date, iv interval, b bytea, ip inet, m mood, p posint, f4 real, f8 float8,
  i2 int2, i8 int8, bo bool, t text, vc varchar(5), c3 char(3), tm time, o oid, mac macaddr, pt point, r int4range);
ALTER TABLE typed REPLICA IDENTITY FULL`

const typesSeed = `INSERT INTO accounts (id, balance) VALUES (1, 100), (2, 200), (3, 300), (4, 400);
INSERT INTO typed VALUES
 (1, '12345678-9abc-def0-1234-56789abcdef0', '{"a": 1, "b": [1,2]}', '{"b": 2, "a": {"c": null}}', '{1,2,3}', '{"x","y z",NULL}', 0.00, 12.5,
  '2024-02-29 12:34:56.789', '2024-02-29 12:34:56.789+02', '2024-02-29', '1 year 2 mons 3 days 04:05:06.7', '\x00ff10', '10.0.0.1/8', 'happy', 7, 1.5, 2.25,
  -3, 9000000000, true, 'hello', 'abc', 'ab', '13:14:15', 42, '08:00:2b:01:02:03', '(1,2)', '[1,5)'),
 (2, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL,
  NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL),
 (3, '00000000-0000-0000-0000-000000000000', '[]', '"s"', '{}', '{}', -1e-20, -0.01, '0001-01-01 00:00:00', 'infinity', '-infinity', '-1 days', '', '::1', 'sad', 1, 'NaN', '-Infinity',
  32767, -9223372036854775808, false, '', '', '', '00:00:00', 0, 'ff:ff:ff:ff:ff:ff', '(0,0)', 'empty')`

const readBalance = "SELECT balance FROM accounts WHERE id = $1"

func typesStack(t testing.TB) *stack {
	s := startStack(t, typesDDL, typesSeed, readBalance, "SELECT * FROM typed WHERE id = $1",
		"UPDATE accounts SET balance = balance + $1 WHERE id = $2")
	s.waitReady(t, readBalance, 1)
	return s
}

// rawResult is a result as pgx received it: descriptions, raw values in
// the formats asked for, command tag.
type rawResult struct {
	Fields []pgconn.FieldDescription
	Rows   [][][]byte
	Tag    string
}

func rawQuery(ctx context.Context, conn *pgx.Conn, sql string, args ...any) (rawResult, error) {
	var r rawResult
	rows, err := conn.Query(ctx, sql, args...)
	if err != nil {
		return r, err
	}
	defer rows.Close()
	r.Fields = append(r.Fields, rows.FieldDescriptions()...)
	for rows.Next() {
		var row [][]byte
		for _, v := range rows.RawValues() {
			if v == nil {
				row = append(row, nil)
			} else {
				row = append(row, append([]byte{}, v...))
			}
		}
		r.Rows = append(r.Rows, row)
	}
	rows.Close()
	r.Tag = rows.CommandTag().String()
	return r, rows.Err()
}

type diffCase struct {
	sql  string
	args []any
}

func diffCases() []diffCase {
	return []diffCase{
		{"SELECT * FROM typed ORDER BY id", nil},
		{"SELECT * FROM typed WHERE id = $1", []any{1}},
		{"SELECT * FROM typed WHERE id = $1", []any{int64(3)}},
		{"SELECT * FROM typed WHERE id = $1", []any{"2"}},
		{"SELECT id, t FROM typed WHERE t = $1", []any{"hello"}},
		{"SELECT id FROM typed WHERE u = $1", []any{"12345678-9abc-def0-1234-56789abcdef0"}},
		{"SELECT id, ia, ta FROM typed WHERE id = ANY($1) ORDER BY id", []any{[]int32{1, 3}}},
		{"SELECT id, n, n2, f4, f8 FROM typed WHERE id = 3", nil},
		{readBalance, []any{1}},
		{"SELECT count(*), sum(balance) FROM accounts", nil},
		{"SELECT $1::int4 + 1 AS next, $2::text AS word", []any{41, "w"}},
		{"VALUES (1, 'a'), (2, NULL)", nil},
		{"SELECT id FROM typed WHERE false", nil},
		{"SHOW TimeZone", nil},
	}
}

// modes are the ways pgx sends a query: the simple protocol, prepared
// statements with its binary formats, the unnamed statement, and text
// results asked for explicitly.
var modes = []struct {
	name string
	opts []any
}{
	{"simple", []any{pgx.QueryExecModeSimpleProtocol}},
	{"prepared-binary", []any{pgx.QueryExecModeCacheStatement}},
	{"unnamed", []any{pgx.QueryExecModeDescribeExec}},
	{"prepared-text", []any{pgx.QueryExecModeCacheStatement, pgx.QueryResultFormats{pgx.TextFormatCode}}},
	{"exec-text", []any{pgx.QueryExecModeExec, pgx.QueryResultFormats{pgx.TextFormatCode}}},
}

// TestDifferentialThroughFront: every statement answered through the
// front inside BEGIN READ ONLY (from the cache the second time) equals
// PostgreSQL's own answer, byte for byte, in every protocol and format;
// after a write, a transaction begun more than its staleness later sees
// it; after a write on the same front session, at once.
func TestDifferentialThroughFront(t *testing.T) {
	s := typesStack(t)
	ctx := context.Background()
	direct := connect(t, s.url)
	for round := 0; round < 3; round++ {
		front := connect(t, s.frontURL)
		for _, c := range []*pgx.Conn{direct, front} {
			if _, err := c.Exec(ctx, "BEGIN READ ONLY"); err != nil {
				t.Fatal(err)
			}
		}
		for _, m := range modes {
			for _, c := range diffCases() {
				args := append(append([]any{}, m.opts...), c.args...)
				want, err := rawQuery(ctx, direct, c.sql, args...)
				if err != nil {
					t.Fatalf("%s %s: PostgreSQL: %v", m.name, c.sql, err)
				}
				got, err := rawQuery(ctx, front, c.sql, args...)
				if err != nil {
					t.Fatalf("round %d %s %s %v: through the front: %v", round, m.name, c.sql, c.args, err)
				}
				if !reflect.DeepEqual(got, want) {
					t.Fatalf("round %d %s %s %v:\nfront:      %+v\npostgresql: %+v", round, m.name, c.sql, c.args, got, want)
				}
			}
		}
		for _, c := range []*pgx.Conn{direct, front} {
			if _, err := c.Exec(ctx, "COMMIT"); err != nil {
				t.Fatal(err)
			}
		}
	}
	st := s.front.Stats()
	if st.Hits.Load() == 0 || st.Misses.Load() == 0 || st.Transactions.Load() != 3 {
		t.Fatalf("hits %d, misses %d, uncached %d, Larder transactions %d: want hits and misses in 3 transactions",
			st.Hits.Load(), st.Misses.Load(), st.Uncached.Load(), st.Transactions.Load())
	}
	t.Logf("served %d (hits %d, misses %d, uncached %d), relayed %d", st.Served.Load(), st.Hits.Load(), st.Misses.Load(), st.Uncached.Load(), st.Relayed.Load())

	t.Run("staleness", func(t *testing.T) {
		front := connect(t, s.frontURL)
		for i := 0; i < 3; i++ {
			if _, err := direct.Exec(ctx, "UPDATE accounts SET balance = balance + 1 WHERE id = 1"); err != nil {
				t.Fatal(err)
			}
			var want int
			if err := direct.QueryRow(ctx, readBalance, 1).Scan(&want); err != nil {
				t.Fatal(err)
			}
			time.Sleep(1100 * time.Millisecond)
			got := readInTx(t, front, "1s", 1)
			if got != want {
				t.Fatalf("a Larder transaction with staleness 1s begun 1.1s after the write read %d, want %d", got, want)
			}
		}
	})

	t.Run("read-your-writes", func(t *testing.T) {
		front := connect(t, s.frontURL)
		for i := 0; i < 5; i++ {
			_ = readInTx(t, front, "", 2) // cached at an older snapshot
			var want int
			if err := front.QueryRow(ctx, "UPDATE accounts SET balance = balance + 10 WHERE id = 2 RETURNING balance").Scan(&want); err != nil {
				t.Fatal(err)
			}
			if got := readInTx(t, front, "", 2); got != want {
				t.Fatalf("after its own write the session read %d, want %d", got, want)
			}
		}
	})

	t.Run("errors", func(t *testing.T) {
		front := connect(t, s.frontURL)
		for _, c := range []*pgx.Conn{direct, front} {
			if _, err := c.Exec(ctx, "BEGIN READ ONLY"); err != nil {
				t.Fatal(err)
			}
		}
		for _, sql := range []string{"SELECT 1/0", "SELECT nosuchcolumn FROM accounts", "SELEC 1"} {
			_, want := rawQuery(ctx, direct, sql)
			_, got := rawQuery(ctx, front, sql)
			var wp, gp *pgconn.PgError
			if !errors.As(want, &wp) || !errors.As(got, &gp) || wp.Code != gp.Code || wp.Message != gp.Message || wp.Position != gp.Position {
				t.Fatalf("%s: front %v, PostgreSQL %v", sql, got, want)
			}
			for _, c := range []*pgx.Conn{direct, front} {
				if _, err := c.Exec(ctx, "ROLLBACK"); err != nil {
					t.Fatal(err)
				}
				if _, err := c.Exec(ctx, "BEGIN READ ONLY"); err != nil {
					t.Fatal(err)
				}
			}
		}
		_, err := rawQuery(ctx, front, "UPDATE accounts SET balance = 0")
		var pe *pgconn.PgError
		if !errors.As(err, &pe) || pe.Code != codeReadOnlyTransaction {
			t.Fatalf("a write in a Larder transaction: %v, want 25006", err)
		}
		if _, err := front.Exec(ctx, "ROLLBACK"); err != nil {
			t.Fatal(err)
		}
		if _, err := direct.Exec(ctx, "ROLLBACK"); err != nil {
			t.Fatal(err)
		}
	})
}

// readInTx reads account id's balance in a Larder transaction of conn,
// with SET LOCAL larder.staleness = staleness when given.
func readInTx(t *testing.T, conn *pgx.Conn, staleness string, id int) int {
	t.Helper()
	ctx := context.Background()
	if _, err := conn.Exec(ctx, "BEGIN READ ONLY"); err != nil {
		t.Fatal(err)
	}
	if staleness != "" {
		if _, err := conn.Exec(ctx, "SET LOCAL larder.staleness = '"+staleness+"'"); err != nil {
			t.Fatal(err)
		}
	}
	var n int
	if err := conn.QueryRow(ctx, readBalance, id).Scan(&n); err != nil {
		t.Fatal(err)
	}
	if _, err := conn.Exec(ctx, "COMMIT"); err != nil {
		t.Fatal(err)
	}
	return n
}

// wireConn is a protocol-level connection: messages in, encoded messages
// out, to compare answers byte for byte.
type wireConn struct {
	conn net.Conn
	fe   *pgproto3.Frontend
}

func dialWire(t testing.TB, addr, user, database string) *wireConn {
	t.Helper()
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	w := &wireConn{conn: conn, fe: pgproto3.NewFrontend(conn, conn)}
	w.fe.Send(&pgproto3.StartupMessage{ProtocolVersion: pgproto3.ProtocolVersion30, Parameters: map[string]string{"user": user, "database": database}})
	if err := w.fe.Flush(); err != nil {
		t.Fatal(err)
	}
	for {
		msg, err := w.fe.Receive()
		if err != nil {
			t.Fatal(err)
		}
		switch m := msg.(type) {
		case *pgproto3.ErrorResponse:
			t.Fatalf("start-up: %s", m.Message)
		case *pgproto3.ReadyForQuery:
			return w
		}
	}
}

// exchange sends msgs and returns the encoded answers up to the
// ReadyForQuery of each Sync or Query among them.
func (w *wireConn) exchange(t testing.TB, msgs ...pgproto3.FrontendMessage) [][]byte {
	t.Helper()
	waits := 0
	for _, m := range msgs {
		w.fe.Send(m)
		switch m.(type) {
		case *pgproto3.Sync, *pgproto3.Query:
			waits++
		}
	}
	if err := w.fe.Flush(); err != nil {
		t.Fatal(err)
	}
	_ = w.conn.SetReadDeadline(time.Now().Add(20 * time.Second))
	var out [][]byte
	for waits > 0 {
		msg, err := w.fe.Receive()
		if err != nil {
			t.Fatal(err)
		}
		// Where in PostgreSQL's source an error or a warning was raised
		// is not the answer; the front's own cannot name it.
		switch e := msg.(type) {
		case *pgproto3.ErrorResponse:
			e.File, e.Line, e.Routine = "", 0, ""
		case *pgproto3.NoticeResponse:
			e.File, e.Line, e.Routine = "", 0, ""
		}
		b, err := msg.Encode(nil)
		if err != nil {
			t.Fatal(err)
		}
		out = append(out, b)
		if _, ok := msg.(*pgproto3.ReadyForQuery); ok {
			waits--
		}
	}
	return out
}

func be32(n int32) []byte { return binary.BigEndian.AppendUint32(nil, uint32(n)) }

// wireSteps are message sequences of one Larder transaction: simple and
// extended protocol, named and unnamed statements and portals, text and
// binary parameters and results, row limits, several statements in one
// query, an empty query.
func wireSteps() [][]pgproto3.FrontendMessage {
	sync := &pgproto3.Sync{}
	return [][]pgproto3.FrontendMessage{
		// larder.staleness: PostgreSQL keeps it as a placeholder setting,
		// and answers as the front does.
		{&pgproto3.Query{String: "SET larder.staleness = '5s'"}},
		{&pgproto3.Parse{Query: "SET larder.staleness = '4s'"}, &pgproto3.Bind{}, &pgproto3.Execute{}, sync},
		{&pgproto3.Query{String: "SHOW larder.staleness"}},
		// A Larder transaction begun and ended inside pipelines, with
		// statements around them.
		{&pgproto3.Parse{Query: "BEGIN READ ONLY"}, &pgproto3.Bind{}, &pgproto3.Execute{},
			&pgproto3.Parse{Query: readBalance}, &pgproto3.Bind{Parameters: [][]byte{[]byte("2")}}, &pgproto3.Describe{ObjectType: 'P'}, &pgproto3.Execute{},
			&pgproto3.Parse{Query: "COMMIT"}, &pgproto3.Bind{}, &pgproto3.Execute{},
			&pgproto3.Parse{Query: "SELECT 42 AS n"}, &pgproto3.Bind{}, &pgproto3.Execute{}, sync},
		{&pgproto3.Query{String: "BEGIN READ ONLY; SET LOCAL larder.staleness = '2s'; SHOW larder.staleness; SELECT balance FROM accounts WHERE id = 3; COMMIT; SELECT 'after'"}},
		{&pgproto3.Query{String: "BEGIN READ ONLY"}},
		{&pgproto3.Query{String: "SELECT * FROM typed ORDER BY id"}},
		{&pgproto3.Parse{Name: "s1", Query: "SELECT * FROM typed WHERE id = $1"}, &pgproto3.Describe{ObjectType: 'S', Name: "s1"}, sync},
		{&pgproto3.Bind{PreparedStatement: "s1", ParameterFormatCodes: []int16{1}, Parameters: [][]byte{be32(1)}, ResultFormatCodes: []int16{1}},
			&pgproto3.Describe{ObjectType: 'P'}, &pgproto3.Execute{}, sync},
		{&pgproto3.Bind{PreparedStatement: "s1", Parameters: [][]byte{[]byte("3")}}, &pgproto3.Describe{ObjectType: 'P'}, &pgproto3.Execute{}, sync},
		{&pgproto3.Parse{Query: "SELECT id, t, balance FROM typed JOIN accounts USING (id) ORDER BY id"},
			&pgproto3.Bind{DestinationPortal: "p1", ResultFormatCodes: []int16{1, 0, 1}}, &pgproto3.Describe{ObjectType: 'P', Name: "p1"},
			&pgproto3.Execute{Portal: "p1", MaxRows: 1}, &pgproto3.Execute{Portal: "p1", MaxRows: 1}, &pgproto3.Execute{Portal: "p1"},
			&pgproto3.Execute{Portal: "p1"}, &pgproto3.Close{ObjectType: 'P', Name: "p1"}, sync},
		{&pgproto3.Parse{Query: "SELECT $1::text AS a, $2::int4 AS b", ParameterOIDs: []uint32{25, 23}},
			&pgproto3.Bind{ParameterFormatCodes: []int16{0, 1}, Parameters: [][]byte{[]byte("x"), be32(7)}, ResultFormatCodes: []int16{1}},
			&pgproto3.Describe{ObjectType: 'P'}, &pgproto3.Execute{}, sync},
		{&pgproto3.Parse{Query: "SELECT balance FROM accounts WHERE id = $1"}, &pgproto3.Bind{Parameters: [][]byte{nil}}, &pgproto3.Execute{}, sync},
		{&pgproto3.Query{String: "SELECT 1 AS a; SELECT 'two' AS b, NULL AS c"}},
		{&pgproto3.Query{String: ""}},
		{&pgproto3.Query{String: " ; "}},
		{&pgproto3.Query{String: "SHOW search_path"}},
		{&pgproto3.Query{String: "SELECT FROM accounts WHERE id < 3"}},
		{&pgproto3.Parse{Name: "none", Query: "SELECT FROM accounts"}, &pgproto3.Describe{ObjectType: 'S', Name: "none"},
			&pgproto3.Bind{PreparedStatement: "none"}, &pgproto3.Describe{ObjectType: 'P'}, &pgproto3.Execute{}, sync},
		{&pgproto3.Query{String: "BEGIN READ ONLY"}},
		{&pgproto3.Query{String: "COMMIT AND CHAIN"}},
		{&pgproto3.Query{String: "SELECT balance FROM accounts WHERE id = 2"}},
		{&pgproto3.Query{String: "BEGIN"}},
		{&pgproto3.Parse{Query: "ROLLBACK AND CHAIN"}, &pgproto3.Bind{}, &pgproto3.Execute{}, sync},
		{&pgproto3.Bind{}, &pgproto3.Execute{}, sync},
		{&pgproto3.Query{String: "COMMIT"}},
		{&pgproto3.Query{String: "SELECT balance FROM accounts WHERE id = 4"}},
		// Errors: PostgreSQL's own (its position counted over the whole
		// query string), then a failed transaction.
		{&pgproto3.Query{String: "BEGIN READ ONLY"}},
		{&pgproto3.Query{String: "SELECT 1; SELECT 'é', nosuch FROM accounts"}},
		{&pgproto3.Query{String: "SELECT 1"}},
		{&pgproto3.Parse{Query: "SELECT 2"}, &pgproto3.Bind{}, &pgproto3.Execute{}, sync},
		{&pgproto3.Query{String: "COMMIT"}},
		{&pgproto3.Query{String: "BEGIN READ ONLY"}},
		{&pgproto3.Parse{Query: "SELECT 1/0"}, &pgproto3.Bind{}, &pgproto3.Execute{}, &pgproto3.Parse{Query: "SELECT 1"}, &pgproto3.Bind{}, &pgproto3.Execute{}, sync},
		{&pgproto3.Query{String: "ROLLBACK"}},
		// A parameter PostgreSQL cannot read fails the Bind; an error of
		// the data, the Execute after a Describe.
		{&pgproto3.Query{String: "BEGIN READ ONLY"}},
		{&pgproto3.Parse{Name: "bad", Query: readBalance}, &pgproto3.Bind{PreparedStatement: "bad", Parameters: [][]byte{[]byte("abc")}},
			&pgproto3.Describe{ObjectType: 'P'}, &pgproto3.Execute{}, sync},
		{&pgproto3.Query{String: "ROLLBACK"}},
		{&pgproto3.Query{String: "BEGIN READ ONLY"}},
		{&pgproto3.Parse{Query: "SELECT 1/(balance - balance) FROM accounts WHERE id = $1"}, &pgproto3.Bind{Parameters: [][]byte{[]byte("1")}},
			&pgproto3.Describe{ObjectType: 'P'}, &pgproto3.Execute{}, sync},
		{&pgproto3.Query{String: "ROLLBACK"}},
	}
}

// TestWireBytesThroughFront: the front's answers are PostgreSQL's byte for
// byte, message by message, also when they come from the cache.
func TestWireBytesThroughFront(t *testing.T) {
	s := typesStack(t)
	before := s.front.Stats().Hits.Load()
	for round := 0; round < 3; round++ {
		direct := dialWire(t, "127.0.0.1:"+fmt.Sprint(env.PG.Port()), "postgres", s.db)
		front := dialWire(t, s.front.Addr().String(), "postgres", s.db)
		for i, step := range wireSteps() {
			want := direct.exchange(t, step...)
			got := front.exchange(t, step...)
			if len(got) != len(want) {
				t.Fatalf("round %d step %d: %d messages through the front, %d from PostgreSQL:\n%s\n%s", round, i, len(got), len(want), dump(got), dump(want))
			}
			for j := range want {
				if !bytes.Equal(got[j], want[j]) {
					t.Fatalf("round %d step %d message %d:\nfront:      %q\npostgresql: %q", round, i, j, got[j], want[j])
				}
			}
		}
	}
	if hits := s.front.Stats().Hits.Load() - before; hits == 0 {
		t.Fatal("no answer came from the cache")
	}
}

func dump(msgs [][]byte) string {
	var b strings.Builder
	for _, m := range msgs {
		fmt.Fprintf(&b, "  %q\n", m)
	}
	return b.String()
}
