package larder

import (
	"encoding/binary"
	"errors"
	"fmt"
	"strconv"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"

	"github.com/larderdb/larder/internal/wire"
	"github.com/larderdb/larder/qumaana/quma"
)

// resultVersion is the first byte of an encoded result.
const resultVersion = 1

// errCorruptResult marks a cached result that does not decode; the
// transaction then reads from PostgreSQL instead.
var errCorruptResult = errors.New("larder: corrupt cached result")

// Result is a query's result held in memory: column descriptions and raw
// values in PostgreSQL's wire formats, as pgx received them.
type Result struct {
	Fields []pgconn.FieldDescription
	Rows   [][][]byte // nil value = NULL
}

// readResult drains rows into a Result.
func readResult(rows pgx.Rows) (*Result, error) {
	defer rows.Close()
	r := &Result{Fields: append([]pgconn.FieldDescription(nil), rows.FieldDescriptions()...)}
	for rows.Next() {
		r.Rows = append(r.Rows, copyRow(rows.RawValues()))
	}
	return r, rows.Err()
}

// copyRow copies a row's raw values (valid only until the next row is
// read); nil stays nil (NULL).
func copyRow(raw [][]byte) [][]byte {
	row := make([][]byte, len(raw))
	for i, v := range raw {
		if v != nil {
			row[i] = append([]byte{}, v...)
		}
	}
	return row
}

// encode appends the result's encoding: version, fields (name, table OID,
// column number, type OID, size, modifier, format), then rows of values
// (a varint length + 1, 0 for NULL).
func (r *Result) encode(dst []byte) []byte {
	dst = append(dst, resultVersion)
	dst = binary.AppendUvarint(dst, uint64(len(r.Fields)))
	for _, f := range r.Fields {
		dst = wire.AppendString(dst, f.Name)
		dst = binary.AppendUvarint(dst, uint64(f.TableOID))
		dst = binary.AppendUvarint(dst, uint64(f.TableAttributeNumber))
		dst = binary.AppendUvarint(dst, uint64(f.DataTypeOID))
		dst = binary.AppendVarint(dst, int64(f.DataTypeSize))
		dst = binary.AppendVarint(dst, int64(f.TypeModifier))
		dst = binary.AppendVarint(dst, int64(f.Format))
	}
	dst = binary.AppendUvarint(dst, uint64(len(r.Rows)))
	for _, row := range r.Rows {
		for _, v := range row {
			if v == nil {
				dst = append(dst, 0)
				continue
			}
			dst = binary.AppendUvarint(dst, uint64(len(v))+1)
			dst = append(dst, v...)
		}
	}
	return dst
}

func decodeResult(b []byte) (*Result, error) {
	if len(b) == 0 || b[0] != resultVersion {
		return nil, fmt.Errorf("%w: unknown version", errCorruptResult)
	}
	d := wire.Decoder{B: b[1:], Wrap: errCorruptResult}
	r := &Result{}
	nf := d.Count("fields", 7)
	for i := 0; i < nf && d.Err == nil; i++ {
		f := pgconn.FieldDescription{Name: d.String("name")}
		f.TableOID = uint32(d.Uvarint("table"))
		f.TableAttributeNumber = uint16(d.Uvarint("column"))
		f.DataTypeOID = uint32(d.Uvarint("type"))
		f.DataTypeSize = int16(d.Varint("size"))
		f.TypeModifier = int32(d.Varint("modifier"))
		f.Format = int16(d.Varint("format"))
		r.Fields = append(r.Fields, f)
	}
	nr := d.Count("rows", max(nf, 1))
	for i := 0; i < nr && d.Err == nil; i++ {
		r.Rows = append(r.Rows, decodeRow(&d, nf))
	}
	return r, d.End()
}

// decodeRow decodes one row of nf values (a varint length + 1 each, 0 for
// NULL); the values alias d's bytes.
func decodeRow(d *wire.Decoder, nf int) [][]byte {
	row := make([][]byte, nf)
	for j := 0; j < nf && d.Err == nil; j++ {
		n := d.Uvarint("value length")
		if n == 0 {
			continue
		}
		n--
		if n > uint64(len(d.B)) {
			d.Fail("value of %d bytes in %d", n, len(d.B))
			break
		}
		row[j] = d.B[:n:n]
		d.B = d.B[n:]
	}
	return row
}

// Rows iterates over a Result; Scan decodes with pgx's type map, as pgx
// would have.
type Rows struct {
	res  *Result
	i    int
	tx   *ROTx
	own  *pgxTypeMap // once the transaction ended (typeMap)
	err  error
	done bool
}

func newRows(res *Result, tx *ROTx) *Rows { return &Rows{res: res, i: -1, tx: tx} }

// typeMap is the type map Scan and Values decode with: the transaction's
// while it lasts, then one of the Rows' own. The transaction's goes back
// to the client's pool when it ends, to be used by another transaction,
// possibly at once on another goroutine: a pgtype.Map is not safe for
// concurrent use.
func (r *Rows) typeMap() *pgxTypeMap {
	if r.own == nil {
		if m := r.tx.m; m != nil {
			return m
		}
		r.own = &pgxTypeMap{pgtype.NewMap()}
	}
	return r.own
}

// Next advances to the next row.
func (r *Rows) Next() bool {
	if r.done || r.err != nil {
		return false
	}
	r.i++
	if r.i >= len(r.res.Rows) {
		r.done = true
		return false
	}
	return true
}

// Scan copies the current row's columns into dest, like pgx.Rows.Scan.
func (r *Rows) Scan(dest ...any) error {
	if r.i < 0 || r.i >= len(r.res.Rows) {
		return errors.New("larder: Scan called without a current row")
	}
	if len(dest) != len(r.res.Fields) {
		return fmt.Errorf("larder: %d destinations for %d columns", len(dest), len(r.res.Fields))
	}
	row := r.res.Rows[r.i]
	for i, d := range dest {
		f := r.res.Fields[i]
		if err := r.typeMap().Scan(f.DataTypeOID, f.Format, row[i], d); err != nil {
			r.err = fmt.Errorf("larder: scan column %s: %w", f.Name, err)
			return r.err
		}
	}
	return nil
}

// Values returns the current row's values decoded into Go values.
func (r *Rows) Values() ([]any, error) {
	if r.i < 0 || r.i >= len(r.res.Rows) {
		return nil, errors.New("larder: Values called without a current row")
	}
	out := make([]any, len(r.res.Fields))
	for i, f := range r.res.Fields {
		v := r.res.Rows[r.i][i]
		if v == nil {
			continue
		}
		m := r.typeMap()
		dt, ok := m.TypeForOID(f.DataTypeOID)
		if !ok {
			out[i] = string(v)
			continue
		}
		val, err := dt.Codec.DecodeValue(m.Map, f.DataTypeOID, f.Format, v)
		if err != nil {
			return nil, fmt.Errorf("larder: decode column %s: %w", f.Name, err)
		}
		out[i] = val
	}
	return out, nil
}

// FieldDescriptions describes the columns.
func (r *Rows) FieldDescriptions() []pgconn.FieldDescription { return r.res.Fields }

// Err is the error that stopped the iteration, if any.
func (r *Rows) Err() error { return r.err }

// Close ends the iteration.
func (r *Rows) Close() { r.done = true }

// Len is the number of rows.
func (r *Rows) Len() int { return len(r.res.Rows) }

// splitKeys reads the key column of a row split (quma.RowSplit) of every
// row, once the result's columns are named as the split expects.
func (r *Result) splitKeys(s *quma.RowSplit) ([]int64, bool) {
	if len(r.Fields) != len(s.Outputs) {
		return nil, false
	}
	for i, f := range r.Fields {
		if f.Name != s.Outputs[i] {
			return nil, false
		}
	}
	return r.intColumn(s.Output, s.OutputName)
}

// intColumn reads column i, which must be named name, of every row as an
// integer (int2, int4 or int8, in text or binary format); false for
// another name or type, or a NULL.
func (r *Result) intColumn(i int, name string) ([]int64, bool) {
	if i < 0 || i >= len(r.Fields) || r.Fields[i].Name != name {
		return nil, false
	}
	f := r.Fields[i]
	var size int
	switch f.DataTypeOID {
	case pgtype.Int2OID:
		size = 2
	case pgtype.Int4OID:
		size = 4
	case pgtype.Int8OID:
		size = 8
	default:
		return nil, false
	}
	out := make([]int64, len(r.Rows))
	for j, row := range r.Rows {
		if i >= len(row) || row[i] == nil {
			return nil, false
		}
		v := row[i]
		switch f.Format {
		case pgtype.TextFormatCode:
			n, err := strconv.ParseInt(string(v), 10, 64)
			if err != nil {
				return nil, false
			}
			out[j] = n
		case pgtype.BinaryFormatCode:
			if len(v) != size {
				return nil, false
			}
			switch size {
			case 2:
				out[j] = int64(int16(binary.BigEndian.Uint16(v)))
			case 4:
				out[j] = int64(int32(binary.BigEndian.Uint32(v)))
			default:
				out[j] = int64(binary.BigEndian.Uint64(v))
			}
		default:
			return nil, false
		}
	}
	return out, true
}
