package larder

import (
	"encoding/binary"
	"fmt"

	"github.com/larderdb/larder/internal/recipe"
	"github.com/larderdb/larder/internal/wire"
)

// recipeResult cuts the result at row boundaries for the recipe codec:
// the header is the encoding of the columns with no rows (encode), each
// row its values as encode writes them. The rows share one allocation.
func (r *Result) recipeResult() recipe.Result {
	hdr := (&Result{Fields: r.Fields}).encode(nil)
	ends := make([]int, len(r.Rows))
	var buf []byte
	for i, row := range r.Rows {
		for _, v := range row {
			if v == nil {
				buf = append(buf, 0)
				continue
			}
			buf = binary.AppendUvarint(buf, uint64(len(v))+1)
			buf = append(buf, v...)
		}
		ends[i] = len(buf)
	}
	rows := make([][]byte, len(r.Rows))
	start := 0
	for i, end := range ends {
		rows[i] = buf[start:end:end]
		start = end
	}
	return recipe.Result{Header: hdr, Rows: rows}
}

// resultFromRecipe is recipeResult's inverse. The values alias rr.
func resultFromRecipe(rr recipe.Result) (*Result, error) {
	r, err := decodeResult(rr.Header)
	if err != nil {
		return nil, err
	}
	if len(r.Rows) != 0 {
		return nil, fmt.Errorf("%w: a recipe header with rows", errCorruptResult)
	}
	nf := len(r.Fields)
	r.Rows = make([][][]byte, len(rr.Rows))
	for i, b := range rr.Rows {
		d := wire.Decoder{B: b, Wrap: errCorruptResult}
		row := decodeRow(&d, nf)
		if err := d.End(); err != nil {
			return nil, err
		}
		r.Rows[i] = row
	}
	return r, nil
}
