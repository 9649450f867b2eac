// Package mix is the RUBiS client emulator's walk over a transition
// table (the original bidding and browsing tables, kept beside this file):
// from each state it draws the next by the column of that state, follows
// Back and End of Session, and gives each page its think time.
package mix

import (
	"bufio"
	"embed"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand"
	"strconv"
	"strings"
	"time"

	"github.com/larderdb/larder/bench/rubis/app"
)

//go:embed bidding_transitions.tsv browsing_transitions.tsv
var tables embed.FS

// States are the 27 pages, in the tables' order: the application's paths.
var States = app.Interactions

// Writing pages.
var Writes = map[string]bool{"RegisterUser": true, "StoreBuyNow": true, "StoreBid": true, "StoreComment": true, "RegisterItem": true}

// numStates is len(States).
const numStates = 27

const (
	back = numStates     // the Back row
	end  = numStates + 1 // the End of Session row
	rows = numStates + 2
)

// Table is a transition table: P[from][to] over the 27 states plus Back
// and End of Session, and each state's think time.
type Table struct {
	P     [][]float64
	Think []time.Duration
}

// Load reads "bidding" or "browsing".
func Load(name string) (*Table, error) {
	f, err := tables.Open(name + "_transitions.tsv")
	if err != nil {
		return nil, fmt.Errorf("mix: no %s table", name)
	}
	defer f.Close()
	return Parse(f)
}

// Parse reads a transition table in the original format: tab-separated,
// one row per "to" state (the 27, Back probability, End of Session), one
// column per "from" state, the think time in ms last.
func Parse(r io.Reader) (*Table, error) {
	t := &Table{P: make([][]float64, len(States)), Think: make([]time.Duration, len(States))}
	for i := range t.P {
		t.P[i] = make([]float64, rows)
	}
	sc := bufio.NewScanner(r)
	row := 0
	for sc.Scan() && row < rows {
		fields := strings.Split(sc.Text(), "\t")
		if len(fields) < len(States)+1 {
			continue
		}
		name := strings.TrimSpace(fields[0])
		if row == 0 && name != "Home" {
			continue // headers
		}
		for from := 0; from < len(States); from++ {
			p, err := strconv.ParseFloat(strings.TrimSpace(fields[1+from]), 64)
			if err != nil || p < 0 || math.IsNaN(p) {
				return nil, fmt.Errorf("mix: row %q, column %d: bad probability %q", name, from+1, fields[1+from])
			}
			t.P[from][row] = p
		}
		if row < len(States) && len(fields) > len(States)+1 {
			ms, err := strconv.Atoi(strings.TrimSpace(fields[len(States)+1]))
			if err != nil {
				return nil, fmt.Errorf("mix: row %q: bad think time %q", name, fields[len(States)+1])
			}
			t.Think[row] = time.Duration(ms) * time.Millisecond
		}
		row++
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	if row != rows {
		return nil, errors.New("mix: the table has fewer than 29 rows")
	}
	return t, nil
}

// MaxSessionRequests ends a session, as the original emulator does.
const MaxSessionRequests = 1000

// Walker is one emulated user's walk.
type Walker struct {
	t        *Table
	r        *rand.Rand
	cur      int
	history  []int
	requests int
	sessions int
}

// NewWalker starts at Home.
func NewWalker(t *Table, seed int64) *Walker {
	return &Walker{t: t, r: rand.New(rand.NewSource(seed))}
}

// Sessions is the number of sessions started so far.
func (w *Walker) Sessions() int { return w.sessions + 1 }

// Next returns the next page to request. The first call returns Home.
func (w *Walker) Next() string {
	if w.requests == 0 && w.sessions == 0 && len(w.history) == 0 {
		w.requests = 1
		return States[0]
	}
	next := w.draw()
	switch {
	case next == end || w.requests >= MaxSessionRequests:
		w.sessions++
		w.history = w.history[:0]
		w.requests = 0
		next = 0
	case next == back:
		if len(w.history) == 0 {
			next = 0
		} else {
			next = w.history[len(w.history)-1]
			w.history = w.history[:len(w.history)-1]
		}
	default:
		w.history = append(w.history, w.cur)
	}
	w.cur = next
	w.requests++
	return States[next]
}

// draw takes the first row whose running sum down the current column
// exceeds r; a column summing below 1 reloads the current state.
func (w *Walker) draw() int {
	r := w.r.Float64()
	sum := 0.0
	for to, p := range w.t.P[w.cur] {
		sum += p
		if r < sum {
			return to
		}
	}
	return w.cur
}

// ThinkTime draws a TPC-W think time: exponential with mean 7 s, none
// above 70 s (the original's cut-off), scaled by factor.
func (w *Walker) ThinkTime(factor float64) time.Duration {
	t := -7000 * math.Log(1-w.r.Float64())
	if t > 70000 {
		t = 0
	}
	return time.Duration(t*factor) * time.Millisecond
}
