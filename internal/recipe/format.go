package recipe

import (
	"encoding/binary"
	"fmt"
	"sort"

	"github.com/larderdb/larder/internal/wire"
)

// Version is the format version this package writes and reads: the first
// byte of every message. FORMAT.md describes version 1.
const Version = 1

// Message kinds: the second byte of every message.
const (
	KindRecipe  = 'R' // origin → edge: a result as a recipe
	KindRefetch = 'Q' // edge → origin: rows the edge lacks, or the whole result
	KindFill    = 'F' // origin → edge: the rows a refetch asked for
	KindReset   = 'S' // edge → origin: forget what the edge holds; its budget
)

// Run kinds in a recipe: the low bit of a run's varint.
const (
	runLiteral = 0
	runRef     = 1
)

// Refetch flag bits.
const (
	flagAll    = 1 << 0
	knownFlags = flagAll
)

// Result is an encoded query result cut at row boundaries: the column
// descriptions and the rows, each an opaque byte string. Results a decoder
// returns alias its input and the RowStore's rows: they must not be
// modified.
type Result struct {
	Header []byte
	Rows   [][]byte
}

// Size returns the bytes of the header and rows.
func (r Result) Size() int64 {
	n := int64(len(r.Header))
	for _, row := range r.Rows {
		n += int64(len(row))
	}
	return n
}

// Part is one row of a parsed recipe: its bytes, or a reference to a row
// the origin believes the edge holds.
type Part struct {
	IsRef bool
	Ref   RowHash // when IsRef
	Data  []byte  // when !IsRef; aliases the parsed message
}

// Recipe is a parsed recipe message.
type Recipe struct {
	// Whole is the whole-result hash the rebuilt result must have.
	Whole  Sum
	Header []byte // aliases the parsed message
	Parts  []Part
}

// Refs counts the parts that are references.
func (rc *Recipe) Refs() int {
	n := 0
	for i := range rc.Parts {
		if rc.Parts[i].IsRef {
			n++
		}
	}
	return n
}

// decoder starts reading message b of kind want.
func decoder(b []byte, want byte) (*wire.Decoder, error) {
	if len(b) < 2 {
		return nil, fmt.Errorf("%w: message of %d bytes", ErrCorrupt, len(b))
	}
	if b[0] != Version {
		return nil, fmt.Errorf("%w: %d", ErrVersion, b[0])
	}
	if b[1] != want {
		return nil, fmt.Errorf("%w: %q, want %q", ErrKind, b[1], want)
	}
	return &wire.Decoder{B: b[2:], Wrap: ErrCorrupt}, nil
}

// fixed reads n bytes (aliasing the message).
func fixed(d *wire.Decoder, n int, what string) []byte {
	if d.Err != nil {
		return nil
	}
	if len(d.B) < n {
		d.Fail("%s: %d bytes left, want %d", what, len(d.B), n)
		return nil
	}
	b := d.B[:n:n]
	d.B = d.B[n:]
	return b
}

// rowCount reads a count of rows, each at least min bytes long, within
// lim.MaxRows.
func rowCount(d *wire.Decoder, what string, min int, lim Limits) (int, error) {
	n := d.Count(what, min)
	if d.Err != nil {
		return 0, d.Err
	}
	if n > lim.MaxRows {
		return 0, fmt.Errorf("%w: %d %s, limit %d", ErrTooLarge, n, what, lim.MaxRows)
	}
	return n, nil
}

func header(kind byte, dst []byte) []byte { return append(dst, Version, kind) }

// ParseRecipe parses a recipe message. The parts alias b. It checks the
// message's structure and lim.MaxRows; what the references resolve to is
// the RowStore's business.
func ParseRecipe(b []byte, lim Limits) (*Recipe, error) {
	d, err := decoder(b, KindRecipe)
	if err != nil {
		return nil, err
	}
	rc := &Recipe{}
	copy(rc.Whole[:], fixed(d, SumSize, "whole-result hash"))
	rc.Header = d.Bytes("header")
	// A literal row takes at least its length byte, so no more rows than
	// bytes left can be announced: the allocation below is bounded by the
	// message's size.
	n, err := rowCount(d, "rows", 1, lim)
	if err != nil {
		return nil, err
	}
	rc.Parts = make([]Part, 0, n)
	for len(rc.Parts) < n && d.Err == nil {
		run := d.Uvarint("run")
		k, count := run&1, run>>1
		if d.Err != nil {
			break
		}
		if count == 0 || count > uint64(n-len(rc.Parts)) {
			d.Fail("run of %d rows with %d rows left", count, n-len(rc.Parts))
			break
		}
		for i := uint64(0); i < count && d.Err == nil; i++ {
			if k == runRef {
				p := Part{IsRef: true}
				copy(p.Ref[:], fixed(d, RefSize, "row reference"))
				rc.Parts = append(rc.Parts, p)
			} else {
				rc.Parts = append(rc.Parts, Part{Data: d.Bytes("row")})
			}
		}
	}
	if err := d.End(); err != nil {
		return nil, err
	}
	return rc, nil
}

// recipeWriter appends a recipe's runs.
type recipeWriter struct {
	dst  []byte
	sums []Sum
	refs []bool // per row: sent as a reference
	rows [][]byte
}

func (w *recipeWriter) write(whole Sum, hdr []byte) []byte {
	dst := header(KindRecipe, w.dst)
	dst = append(dst, whole[:]...)
	dst = wire.AppendBytes(dst, hdr)
	dst = binary.AppendUvarint(dst, uint64(len(w.rows)))
	for i := 0; i < len(w.rows); {
		j := i + 1
		for j < len(w.rows) && w.refs[j] == w.refs[i] {
			j++
		}
		k := uint64(runLiteral)
		if w.refs[i] {
			k = runRef
		}
		dst = binary.AppendUvarint(dst, uint64(j-i)<<1|k)
		for ; i < j; i++ {
			if w.refs[i] {
				dst = append(dst, w.sums[i][:RefSize]...)
			} else {
				dst = wire.AppendBytes(dst, w.rows[i])
			}
		}
	}
	return dst
}

// AppendVerbatim appends res as a recipe without references: what the
// origin answers to Refetch{All: true}, and what it sends an edge it does
// not track. It changes no Tracker.
func AppendVerbatim(dst []byte, res Result) []byte {
	sums := make([]Sum, len(res.Rows))
	for i, row := range res.Rows {
		sums[i] = rowSum(row)
	}
	w := recipeWriter{dst: dst, sums: sums, refs: make([]bool, len(res.Rows)), rows: res.Rows}
	return w.write(wholeSum(res.Header, sums), res.Header)
}

// Refetch is the edge's one batched request after a recipe it could not
// rebuild: the rows it lacks, or (All) the whole result verbatim after a
// whole-result hash mismatch. The transport carries it to the origin
// together with whatever names the miss (the origin answers from the
// result it still holds for it, or by running the query again at the same
// pin).
type Refetch struct {
	All    bool
	Hashes []RowHash // sorted, without duplicates; empty when All
}

// Empty reports whether nothing is asked.
func (r Refetch) Empty() bool { return !r.All && len(r.Hashes) == 0 }

// Append appends the request message (hashes sorted, duplicates dropped).
func (r Refetch) Append(dst []byte) []byte {
	hs := append([]RowHash(nil), r.Hashes...)
	sortHashes(hs)
	r.Hashes = hs[:0]
	for i, h := range hs {
		if i == 0 || h != hs[i-1] {
			r.Hashes = append(r.Hashes, h)
		}
	}
	dst = header(KindRefetch, dst)
	var flags byte
	if r.All {
		flags |= flagAll
	}
	dst = append(dst, flags)
	dst = binary.AppendUvarint(dst, uint64(len(r.Hashes)))
	for _, h := range r.Hashes {
		dst = append(dst, h[:]...)
	}
	return dst
}

// ParseRefetch parses a request message.
func ParseRefetch(b []byte, lim Limits) (Refetch, error) {
	d, err := decoder(b, KindRefetch)
	if err != nil {
		return Refetch{}, err
	}
	flags := d.Byte("flags")
	if d.Err == nil && flags&^knownFlags != 0 {
		d.Fail("unknown flags %#x", flags)
	}
	n, err := rowCount(d, "hashes", RefSize, lim)
	if err != nil {
		return Refetch{}, err
	}
	r := Refetch{All: flags&flagAll != 0}
	if r.All && n > 0 {
		d.Fail("a request for the whole result lists %d hashes", n)
	}
	if n > 0 {
		r.Hashes = make([]RowHash, n)
	}
	for i := 0; i < n && d.Err == nil; i++ {
		copy(r.Hashes[i][:], fixed(d, RefSize, "hash"))
		if i > 0 && !hashLess(r.Hashes[i-1], r.Hashes[i]) {
			d.Fail("hashes not sorted or repeated")
		}
	}
	if err := d.End(); err != nil {
		return Refetch{}, err
	}
	return r, nil
}

func hashLess(a, b RowHash) bool {
	for i := range a {
		if a[i] != b[i] {
			return a[i] < b[i]
		}
	}
	return false
}

func sortHashes(hs []RowHash) {
	sort.Slice(hs, func(i, j int) bool { return hashLess(hs[i], hs[j]) })
}

// AppendFill appends the origin's answer to a refetch of hashes: the rows
// of res that the hashes name, verbatim. A hash naming no row of res is
// an error wrapping ErrUnknownRow. Refetch{All: true} is answered with
// AppendVerbatim instead.
func AppendFill(dst []byte, res Result, req Refetch) ([]byte, error) {
	if req.All {
		return dst, fmt.Errorf("%w: a request for the whole result is answered by AppendVerbatim", ErrKind)
	}
	want := make(map[RowHash]int, len(req.Hashes))
	for _, h := range req.Hashes {
		want[h] = -1
	}
	for i, left := 0, len(want); i < len(res.Rows) && left > 0; i++ {
		h := HashRow(res.Rows[i])
		if at, ok := want[h]; ok && at < 0 {
			want[h] = i
			left--
		}
	}
	dst = header(KindFill, dst)
	dst = binary.AppendUvarint(dst, uint64(len(req.Hashes)))
	for _, h := range req.Hashes {
		i := want[h]
		if i < 0 {
			return dst, fmt.Errorf("%w: %s", ErrUnknownRow, h)
		}
		dst = wire.AppendBytes(dst, res.Rows[i])
	}
	return dst, nil
}

// Fill is a parsed answer to a refetch of hashes: rows, which the edge
// hashes itself to match them with what it asked for.
type Fill struct {
	Rows [][]byte // alias the parsed message
}

// ParseFill parses a fill message.
func ParseFill(b []byte, lim Limits) (*Fill, error) {
	d, err := decoder(b, KindFill)
	if err != nil {
		return nil, err
	}
	n, err := rowCount(d, "rows", 1, lim)
	if err != nil {
		return nil, err
	}
	f := &Fill{Rows: make([][]byte, 0, n)}
	for i := 0; i < n && d.Err == nil; i++ {
		f.Rows = append(f.Rows, d.Bytes("row"))
	}
	if err := d.End(); err != nil {
		return nil, err
	}
	return f, nil
}

// AppendReset appends the edge's reset message: the origin forgets what it
// believes the edge holds and tracks it from now on with cfg, the edge's
// budget. An edge sends it at start and whenever it empties its RowStore.
func AppendReset(dst []byte, cfg Config) []byte {
	dst = header(KindReset, dst)
	dst = binary.AppendUvarint(dst, uint64(cfg.MaxBytes))
	return binary.AppendUvarint(dst, uint64(cfg.MaxRows))
}

// ParseReset parses a reset message and validates the budget it carries.
func ParseReset(b []byte) (Config, error) {
	d, err := decoder(b, KindReset)
	if err != nil {
		return Config{}, err
	}
	maxBytes := d.Uvarint("max bytes")
	maxRows := d.Uvarint("max rows")
	if err := d.End(); err != nil {
		return Config{}, err
	}
	if maxBytes > 1<<62 || maxRows > maxRowsLimit {
		return Config{}, fmt.Errorf("%w: budget of %d bytes, %d rows", ErrConfig, maxBytes, maxRows)
	}
	cfg := Config{MaxBytes: int64(maxBytes), MaxRows: int(maxRows)}
	return cfg, cfg.Validate()
}
