package main

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/klauspost/compress/gzip"
	"github.com/klauspost/compress/zstd"
	"github.com/restic/chunker"

	"github.com/larderdb/larder/internal/recipe"
	"github.com/larderdb/larder/internal/wire"
)

// measurement is what one scheme put on the wire for each query and how
// long encoding and decoding took.
type measurement struct {
	Scheme string
	Bytes  [2]int64
	Encode [2]time.Duration
	Decode [2]time.Duration
}

// errDiffers: a scheme's decoding did not reproduce the result.
var errDiffers = errors.New("selectsort: decoding did not reproduce the result")

// serialize is the raw result on the wire: the header and every row, each
// length-prefixed. The compressors and the chunker work on these bytes.
func serialize(res recipe.Result) []byte {
	n := res.Size() + int64(len(res.Rows)+1)*3
	b := make([]byte, 0, n)
	b = wire.AppendBytes(b, res.Header)
	b = binary.AppendUvarint(b, uint64(len(res.Rows)))
	for _, row := range res.Rows {
		b = wire.AppendBytes(b, row)
	}
	return b
}

// deserialize cuts the raw stream back into a result.
func deserialize(b []byte) (recipe.Result, error) {
	d := wire.Decoder{B: b, Wrap: errDiffers}
	res := recipe.Result{Header: d.Bytes("header")}
	n := d.Count("rows", 1)
	res.Rows = make([][]byte, 0, n)
	for i := 0; i < n && d.Err == nil; i++ {
		res.Rows = append(res.Rows, d.Bytes("row"))
	}
	return res, d.End()
}

func sameResult(got, want recipe.Result) error {
	if !bytes.Equal(got.Header, want.Header) || len(got.Rows) != len(want.Rows) {
		return fmt.Errorf("%w: %d rows, want %d", errDiffers, len(got.Rows), len(want.Rows))
	}
	for i := range got.Rows {
		if !bytes.Equal(got.Rows[i], want.Rows[i]) {
			return fmt.Errorf("%w: row %d", errDiffers, i)
		}
	}
	return nil
}

// link is one scheme: a sender and a receiver with whatever state they
// keep between the two queries.
type link interface {
	send(res recipe.Result, raw []byte) ([]byte, error)
	receive(msg []byte) (recipe.Result, error)
}

// measure sends both results over a fresh link of the scheme and checks
// that the receiver got them back exactly.
func measure(name string, l link, results [2]recipe.Result, raws [2][]byte) (measurement, error) {
	m := measurement{Scheme: name}
	for q := range results {
		start := time.Now()
		msg, err := l.send(results[q], raws[q])
		m.Encode[q] = time.Since(start)
		if err != nil {
			return m, fmt.Errorf("%s, query %d: %w", name, q+1, err)
		}
		m.Bytes[q] = int64(len(msg))
		start = time.Now()
		got, err := l.receive(msg)
		m.Decode[q] = time.Since(start)
		if err == nil {
			err = sameResult(got, results[q])
		}
		if r, ok := l.(interface{ refetched() int64 }); ok {
			m.Bytes[q] += r.refetched()
		}
		if err != nil {
			return m, fmt.Errorf("%s, query %d: %w", name, q+1, err)
		}
	}
	return m, nil
}

// rawLink sends the serialized result as it is.
type rawLink struct{}

func (rawLink) send(res recipe.Result, _ []byte) ([]byte, error) { return serialize(res), nil }
func (rawLink) receive(msg []byte) (recipe.Result, error)        { return deserialize(msg) }

// zstdLink compresses each result on its own (klauspost/compress zstd,
// default level, one goroutine).
type zstdLink struct {
	enc *zstd.Encoder
	dec *zstd.Decoder
}

func newZstdLink() (*zstdLink, error) {
	enc, err := zstd.NewWriter(nil, zstd.WithEncoderLevel(zstd.SpeedDefault), zstd.WithEncoderConcurrency(1))
	if err != nil {
		return nil, err
	}
	dec, err := zstd.NewReader(nil, zstd.WithDecoderConcurrency(1), zstd.WithDecoderMaxMemory(4<<30))
	if err != nil {
		return nil, err
	}
	return &zstdLink{enc: enc, dec: dec}, nil
}

func (z *zstdLink) send(_ recipe.Result, raw []byte) ([]byte, error) {
	return z.enc.EncodeAll(raw, nil), nil
}

func (z *zstdLink) receive(msg []byte) (recipe.Result, error) {
	raw, err := z.dec.DecodeAll(msg, nil)
	if err != nil {
		return recipe.Result{}, err
	}
	return deserialize(raw)
}

// gzipLink compresses each result on its own (klauspost/compress gzip,
// default level).
type gzipLink struct{}

func (gzipLink) send(_ recipe.Result, raw []byte) ([]byte, error) {
	var buf bytes.Buffer
	w, err := gzip.NewWriterLevel(&buf, gzip.DefaultCompression)
	if err != nil {
		return nil, err
	}
	if _, err := w.Write(raw); err != nil {
		return nil, err
	}
	if err := w.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

func (gzipLink) receive(msg []byte) (recipe.Result, error) {
	r, err := gzip.NewReader(bytes.NewReader(msg))
	if err != nil {
		return recipe.Result{}, err
	}
	raw, err := io.ReadAll(r)
	if err != nil {
		return recipe.Result{}, err
	}
	return deserialize(raw)
}

// Content-defined chunking (restic/chunker, Rabin fingerprints over a
// 64-byte window): cut points at least cdcMin apart, at most cdcMax, and
// on average every 2^cdcAvgBits bytes after the minimum.
const (
	cdcMin     = 512
	cdcMax     = 32 << 10
	cdcAvgBits = 12
	cdcPol     = chunker.Pol(0x3DA3358B4DC173) // an irreducible polynomial of degree 53, restic's test polynomial
)

// cdcLink sends the serialized result cut into content-defined chunks:
// a chunk the receiver was sent before travels as its 16-byte hash (the
// same reference size as recipes), any other chunk verbatim. The
// receiver keeps every chunk (no budget: generous to the scheme).
type cdcLink struct {
	sent   map[recipe.RowHash]bool   // sender: chunks sent before
	held   map[recipe.RowHash][]byte // receiver: chunks received
	chunks int64                     // chunks cut
	bytes  int64                     // bytes cut
	buf    []byte
}

func newCDCLink() *cdcLink {
	return &cdcLink{sent: map[recipe.RowHash]bool{}, held: map[recipe.RowHash][]byte{}, buf: make([]byte, cdcMax)}
}

func (c *cdcLink) send(_ recipe.Result, raw []byte) ([]byte, error) {
	ch := chunker.NewWithBoundaries(bytes.NewReader(raw), cdcPol, cdcMin, cdcMax)
	ch.SetAverageBits(cdcAvgBits)
	var msg []byte
	for {
		chunk, err := ch.Next(c.buf)
		if err == io.EOF {
			return msg, nil
		}
		if err != nil {
			return nil, err
		}
		c.chunks++
		c.bytes += int64(chunk.Length)
		h := recipe.HashRow(chunk.Data)
		if c.sent[h] {
			msg = append(msg, 1)
			msg = append(msg, h[:]...)
			continue
		}
		c.sent[h] = true
		msg = append(msg, 0)
		msg = wire.AppendBytes(msg, chunk.Data)
	}
}

func (c *cdcLink) receive(msg []byte) (recipe.Result, error) {
	var raw []byte
	d := wire.Decoder{B: msg, Wrap: errDiffers}
	for len(d.B) > 0 && d.Err == nil {
		if d.Byte("tag") == 1 {
			if len(d.B) < recipe.RefSize {
				d.Fail("short hash")
				break
			}
			var h recipe.RowHash
			copy(h[:], d.B)
			d.B = d.B[recipe.RefSize:]
			chunk, ok := c.held[h]
			if !ok {
				d.Fail("unknown chunk %s", h)
			}
			raw = append(raw, chunk...)
			continue
		}
		chunk := d.Bytes("chunk")
		c.held[recipe.HashRow(chunk)] = bytes.Clone(chunk)
		raw = append(raw, chunk...)
	}
	if d.Err != nil {
		return recipe.Result{}, d.Err
	}
	return deserialize(raw)
}

// recipeLink is an origin's Tracker and an edge's RowStore. Refetches (none
// when both sides keep in step) travel on the link and are counted in
// the bytes of the query.
type recipeLink struct {
	tracker  *recipe.Tracker
	store    *recipe.RowStore
	last     recipe.Result
	refetch  int64 // bytes of refetch requests and answers for the last query
	compress *zstdLink
}

func newRecipeLink(cfg recipe.Config, compress bool) (*recipeLink, error) {
	tr, err := recipe.NewTracker(cfg)
	if err != nil {
		return nil, err
	}
	st, err := recipe.NewRowStore(cfg)
	if err != nil {
		return nil, err
	}
	l := &recipeLink{tracker: tr, store: st}
	if compress {
		if l.compress, err = newZstdLink(); err != nil {
			return nil, err
		}
	}
	return l, nil
}

func (l *recipeLink) send(res recipe.Result, _ []byte) ([]byte, error) {
	l.last = res
	msg := l.tracker.AppendRecipe(nil, res)
	if l.compress != nil {
		msg = l.compress.enc.EncodeAll(msg, nil)
	}
	return msg, nil
}

func (l *recipeLink) Refetch(_ context.Context, req recipe.Refetch) ([]byte, error) {
	var answer []byte
	var err error
	if req.All {
		answer = recipe.AppendVerbatim(nil, l.last)
	} else {
		answer, err = recipe.AppendFill(nil, l.last, req)
	}
	l.refetch += int64(len(req.Append(nil)) + len(answer))
	return answer, err
}

func (l *recipeLink) refetched() int64 { return l.refetch }

func (l *recipeLink) receive(msg []byte) (recipe.Result, error) {
	l.refetch = 0
	if l.compress != nil {
		var err error
		if msg, err = l.compress.dec.DecodeAll(msg, nil); err != nil {
			return recipe.Result{}, err
		}
	}
	return l.store.Decode(context.Background(), msg, l, recipe.DefaultLimits())
}
