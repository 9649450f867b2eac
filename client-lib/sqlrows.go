package larder

import (
	"database/sql/driver"
	"fmt"
	"io"
	"math"
	"reflect"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgtype"
)

// cachedRows gives database/sql a read-only transaction's result exactly
// as pgx's stdlib driver gives an uncached one: the same driver.Value for
// every column type (the conversions of stdlib.Rows, which pgx does not
// export, are mirrored in valueFuncFor and checked against stdlib by
// TestDifferentialDatabaseSQL), and the same column type information.
type cachedRows struct {
	r     *Rows
	m     *pgtype.Map
	funcs []func([]byte) (driver.Value, error)
}

func newCachedRows(r *Rows, m *pgtype.Map) *cachedRows {
	cr := &cachedRows{r: r, m: m, funcs: make([]func([]byte) (driver.Value, error), len(r.res.Fields))}
	for i, f := range r.res.Fields {
		cr.funcs[i] = valueFuncFor(m, f.DataTypeOID, f.Format)
	}
	return cr
}

func (d *cachedRows) Columns() []string {
	out := make([]string, len(d.r.res.Fields))
	for i, f := range d.r.res.Fields {
		out[i] = f.Name
	}
	return out
}

func (d *cachedRows) Close() error { d.r.Close(); return nil }

func (d *cachedRows) Next(dest []driver.Value) error {
	if !d.r.Next() {
		if err := d.r.Err(); err != nil {
			return err
		}
		return io.EOF
	}
	for i, raw := range d.r.res.Rows[d.r.i] {
		if raw == nil {
			dest[i] = nil
			continue
		}
		v, err := d.funcs[i](raw)
		if err != nil {
			return fmt.Errorf("convert field %d failed: %w", i, err)
		}
		dest[i] = v
	}
	return nil
}

// ColumnTypeDatabaseTypeName is the type's name, or its OID when unknown.
func (d *cachedRows) ColumnTypeDatabaseTypeName(index int) string {
	oid := d.r.res.Fields[index].DataTypeOID
	if dt, ok := d.m.TypeForOID(oid); ok {
		return strings.ToUpper(dt.Name)
	}
	return strconv.FormatInt(int64(oid), 10)
}

// varHeaderSize is PostgreSQL's varlena header, part of a type modifier.
const varHeaderSize = 4

// ColumnTypeLength is the length of variable-length types.
func (d *cachedRows) ColumnTypeLength(index int) (int64, bool) {
	fd := d.r.res.Fields[index]
	switch fd.DataTypeOID {
	case pgtype.TextOID, pgtype.ByteaOID:
		return math.MaxInt64, true
	case pgtype.VarcharOID, pgtype.BPCharOID:
		return int64(fd.TypeModifier - varHeaderSize), true
	case pgtype.VarbitOID:
		return int64(fd.TypeModifier), true
	}
	return 0, false
}

// ColumnTypePrecisionScale is a numeric's precision and scale.
func (d *cachedRows) ColumnTypePrecisionScale(index int) (precision, scale int64, ok bool) {
	fd := d.r.res.Fields[index]
	if fd.DataTypeOID != pgtype.NumericOID {
		return 0, 0, false
	}
	mod := fd.TypeModifier - varHeaderSize
	return int64((mod >> 16) & 0xffff), int64(mod & 0xffff), true
}

// ColumnTypeScanType is the Go type values of the column scan into.
func (d *cachedRows) ColumnTypeScanType(index int) reflect.Type {
	switch d.r.res.Fields[index].DataTypeOID {
	case pgtype.Float8OID:
		return reflect.TypeFor[float64]()
	case pgtype.Float4OID:
		return reflect.TypeFor[float32]()
	case pgtype.Int8OID:
		return reflect.TypeFor[int64]()
	case pgtype.Int4OID:
		return reflect.TypeFor[int32]()
	case pgtype.Int2OID:
		return reflect.TypeFor[int16]()
	case pgtype.BoolOID:
		return reflect.TypeFor[bool]()
	case pgtype.NumericOID:
		return reflect.TypeFor[float64]()
	case pgtype.DateOID, pgtype.TimestampOID, pgtype.TimestamptzOID:
		return reflect.TypeFor[time.Time]()
	case pgtype.ByteaOID:
		return reflect.TypeFor[[]byte]()
	}
	return reflect.TypeFor[string]()
}

// databaseSQLResultFormats are the result formats pgx's stdlib driver asks
// for (binary for these types, text for the rest); the driver's read-only
// transactions ask for the same, so that a value converts alike.
var databaseSQLResultFormats = pgx.QueryResultFormatsByOID{
	pgtype.BoolOID:        1,
	pgtype.ByteaOID:       1,
	pgtype.CIDOID:         1,
	pgtype.DateOID:        1,
	pgtype.Float4OID:      1,
	pgtype.Float8OID:      1,
	pgtype.Int2OID:        1,
	pgtype.Int4OID:        1,
	pgtype.Int8OID:        1,
	pgtype.OIDOID:         1,
	pgtype.TimestampOID:   1,
	pgtype.TimestamptzOID: 1,
	pgtype.XIDOID:         1,
}

// valueFuncFor converts one column's raw values to driver.Values the way
// stdlib.Rows does.
func valueFuncFor(m *pgtype.Map, oid uint32, format int16) func([]byte) (driver.Value, error) {
	switch oid {
	case pgtype.BoolOID:
		var d bool
		plan := m.PlanScan(oid, format, &d)
		return func(src []byte) (driver.Value, error) { err := plan.Scan(src, &d); return d, err }
	case pgtype.ByteaOID:
		var d []byte
		plan := m.PlanScan(oid, format, &d)
		return func(src []byte) (driver.Value, error) { err := plan.Scan(src, &d); return d, err }
	case pgtype.CIDOID, pgtype.OIDOID, pgtype.XIDOID:
		var d pgtype.Uint32
		plan := m.PlanScan(oid, format, &d)
		return func(src []byte) (driver.Value, error) {
			if err := plan.Scan(src, &d); err != nil {
				return nil, err
			}
			return d.Value()
		}
	case pgtype.DateOID:
		var d pgtype.Date
		plan := m.PlanScan(oid, format, &d)
		return func(src []byte) (driver.Value, error) {
			if err := plan.Scan(src, &d); err != nil {
				return nil, err
			}
			return d.Value()
		}
	case pgtype.Float4OID:
		var d float32
		plan := m.PlanScan(oid, format, &d)
		return func(src []byte) (driver.Value, error) { err := plan.Scan(src, &d); return float64(d), err }
	case pgtype.Float8OID:
		var d float64
		plan := m.PlanScan(oid, format, &d)
		return func(src []byte) (driver.Value, error) { err := plan.Scan(src, &d); return d, err }
	case pgtype.Int2OID:
		var d int16
		plan := m.PlanScan(oid, format, &d)
		return func(src []byte) (driver.Value, error) { err := plan.Scan(src, &d); return int64(d), err }
	case pgtype.Int4OID:
		var d int32
		plan := m.PlanScan(oid, format, &d)
		return func(src []byte) (driver.Value, error) { err := plan.Scan(src, &d); return int64(d), err }
	case pgtype.Int8OID:
		var d int64
		plan := m.PlanScan(oid, format, &d)
		return func(src []byte) (driver.Value, error) { err := plan.Scan(src, &d); return d, err }
	case pgtype.JSONOID, pgtype.JSONBOID, pgtype.XMLOID:
		var d []byte
		plan := m.PlanScan(oid, format, &d)
		return func(src []byte) (driver.Value, error) {
			if err := plan.Scan(src, &d); err != nil {
				return nil, err
			}
			return d, nil
		}
	case pgtype.TimestampOID:
		var d pgtype.Timestamp
		plan := m.PlanScan(oid, format, &d)
		return func(src []byte) (driver.Value, error) {
			if err := plan.Scan(src, &d); err != nil {
				return nil, err
			}
			return d.Value()
		}
	case pgtype.TimestamptzOID:
		var d pgtype.Timestamptz
		plan := m.PlanScan(oid, format, &d)
		return func(src []byte) (driver.Value, error) {
			if err := plan.Scan(src, &d); err != nil {
				return nil, err
			}
			return d.Value()
		}
	}
	var d string
	plan := m.PlanScan(oid, format, &d)
	return func(src []byte) (driver.Value, error) { err := plan.Scan(src, &d); return d, err }
}
