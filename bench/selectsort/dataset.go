package main

import (
	"encoding/binary"
	"math/rand/v2"
	"slices"
	"strconv"
	"time"

	"github.com/larderdb/larder/internal/recipe"
)

// The table both queries read. Columns: a key, the two sort keys, a
// timestamp, a title and a body of words, and a payload of random
// characters. Ganesh's SelectSort table held ~280 K rows of ~800 bytes;
// how compressible its text was is not published, so the share of random
// characters is a flag (RandomFraction) and the report states it.
var columns = []column{
	{"id", 20, "int8"}, // int8
	{"k1", 23, "int4"}, // int4: ORDER BY of the first query
	{"k2", 23, "int4"}, // int4: ORDER BY of the second query
	{"created", 1184, "timestamptz"},
	{"title", 25, "text"},
	{"body", 25, "text"},
	{"payload", 25, "text"},
}

type column struct {
	name    string
	oid     uint32
	sqlType string
}

// createTable is the table's DDL.
func createTable(table string) string {
	s := "CREATE TABLE " + table + " ("
	for i, c := range columns {
		if i > 0 {
			s += ", "
		}
		s += c.name + " " + c.sqlType
	}
	return s + ", PRIMARY KEY (id))"
}

// tableRow is one generated row in its columns' text forms.
type tableRow struct {
	id, k1, k2 int64
	created    time.Time
	title      string
	body       string
	payload    string
}

// vocabulary is what titles and bodies are made of: 2 048 words of 3-10
// letters, fixed by the seed.
func vocabulary(rng *rand.Rand) []string {
	words := make([]string, 2048)
	for i := range words {
		w := make([]byte, 3+rng.IntN(8))
		for j := range w {
			w[j] = 'a' + byte(rng.IntN(26))
		}
		words[i] = string(w)
	}
	return words
}

const alnum = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"

// generate returns cfg.Rows rows whose encoded size averages about
// cfg.RowBytes: after the fixed columns, the rest is split between words
// and random characters by cfg.RandomFraction.
func generate(cfg Config) []tableRow {
	rng := rand.New(rand.NewPCG(cfg.Seed, cfg.Seed^0x5e1ec7))
	words := vocabulary(rng)
	sentence := func(n int) string {
		b := make([]byte, 0, n+12)
		for len(b) < n {
			if len(b) > 0 {
				b = append(b, ' ')
			}
			b = append(b, words[rng.IntN(len(words))]...)
		}
		return string(b[:n])
	}
	base := time.Date(2007, 5, 8, 0, 0, 0, 0, time.UTC)
	// Fixed part: 2 + 7×4 bytes of framing, ~6+10+10 digits, 22 of
	// timestamp, ~40 of title.
	const fixed = 2 + 7*4 + 26 + 22 + 40
	rest := max(cfg.RowBytes-fixed, 16)
	rows := make([]tableRow, cfg.Rows)
	for i := range rows {
		n := rest/2 + rng.IntN(rest+1) // ±50%, mean rest
		random := int(float64(n) * cfg.RandomFraction)
		p := make([]byte, random)
		for j := range p {
			p[j] = alnum[rng.IntN(len(alnum))]
		}
		rows[i] = tableRow{
			id:      int64(i + 1),
			k1:      int64(rng.Int32()),
			k2:      int64(rng.Int32()),
			created: base.Add(time.Duration(rng.Int64N(int64(365 * 24 * time.Hour)))).Truncate(time.Second),
			title:   sentence(20 + rng.IntN(41)),
			body:    sentence(n - random),
			payload: string(p),
		}
	}
	return rows
}

// values returns the row's columns in PostgreSQL's text forms.
func (r *tableRow) values() [][]byte {
	return [][]byte{
		strconv.AppendInt(nil, r.id, 10),
		strconv.AppendInt(nil, r.k1, 10),
		strconv.AppendInt(nil, r.k2, 10),
		[]byte(r.created.Format("2006-01-02 15:04:05-07")),
		[]byte(r.title),
		[]byte(r.body),
		[]byte(r.payload),
	}
}

// encodeRow cuts one row as PostgreSQL's DataRow body carries it: the
// column count (uint16), then per column its length (int32, -1 for NULL)
// and its bytes.
func encodeRow(dst []byte, values [][]byte) []byte {
	dst = binary.BigEndian.AppendUint16(dst, uint16(len(values)))
	for _, v := range values {
		if v == nil {
			dst = binary.BigEndian.AppendUint32(dst, 0xffffffff)
			continue
		}
		dst = binary.BigEndian.AppendUint32(dst, uint32(len(v)))
		dst = append(dst, v...)
	}
	return dst
}

// field is one column description of a result's header.
type field struct {
	name                string
	tableOID, typeOID   uint32
	attr, typeSize, fmt int16
	typeMod             int32
}

// encodeHeader writes column descriptions as RowDescription carries them.
func encodeHeader(fields []field) []byte {
	b := binary.BigEndian.AppendUint16(nil, uint16(len(fields)))
	for _, f := range fields {
		b = append(b, f.name...)
		b = append(b, 0)
		b = binary.BigEndian.AppendUint32(b, f.tableOID)
		b = binary.BigEndian.AppendUint16(b, uint16(f.attr))
		b = binary.BigEndian.AppendUint32(b, f.typeOID)
		b = binary.BigEndian.AppendUint16(b, uint16(f.typeSize))
		b = binary.BigEndian.AppendUint32(b, uint32(f.typeMod))
		b = binary.BigEndian.AppendUint16(b, uint16(f.fmt))
	}
	return b
}

// syntheticResults returns the two queries' results over generated rows:
// ORDER BY k1, then ORDER BY k2. Both share the rows' bytes.
func syntheticResults(cfg Config) (first, second recipe.Result) {
	rows := generate(cfg)
	fields := make([]field, len(columns))
	for i, c := range columns {
		fields[i] = field{name: c.name, tableOID: 16384, attr: int16(i + 1), typeOID: c.oid, typeSize: -1, typeMod: -1}
	}
	header := encodeHeader(fields)
	encoded := make([][]byte, len(rows))
	for i := range rows {
		encoded[i] = encodeRow(nil, rows[i].values())
	}
	order := func(key func(*tableRow) int64) [][]byte {
		idx := make([]int, len(rows))
		for i := range idx {
			idx[i] = i
		}
		slices.SortStableFunc(idx, func(a, b int) int {
			ka, kb := key(&rows[a]), key(&rows[b])
			if ka != kb {
				if ka < kb {
					return -1
				}
				return 1
			}
			return int(rows[a].id - rows[b].id)
		})
		out := make([][]byte, len(idx))
		for i, j := range idx {
			out[i] = encoded[j]
		}
		return out
	}
	first = recipe.Result{Header: header, Rows: order(func(r *tableRow) int64 { return r.k1 })}
	second = recipe.Result{Header: header, Rows: order(func(r *tableRow) int64 { return r.k2 })}
	return first, second
}
