// Package history checks that read-only transactions read one consistent,
// fresh-enough database snapshot. Writers change rows of a table
// accounts(id int, balance int, ver int) directly on PostgreSQL; a
// Recorder decodes the commits from logical replication (their LSNs,
// commit times and new row states); readers record what each read-only
// transaction read. Check then reconstructs the database state at every
// commit and verifies, for each transaction, that one snapshot T explains
// every value it read, that T was current no earlier than its begin time
// minus its staleness limit, and that the balances it read in full sum to
// the total.
package history

import (
	"fmt"
	"sort"
	"strings"
	"time"
)

// Row is an account's state.
type Row struct {
	Balance, Ver int
}

// Commit is one decoded transaction.
type Commit struct {
	LSN  uint64
	Time time.Time
	Rows map[int]Row // new states of the rows it changed
}

// Log is the decoded commit history, by LSN, and the state before it.
type Log struct {
	Initial map[int]Row
	Commits []Commit
}

// ReadTx is what one read-only transaction read.
type ReadTx struct {
	Begin     time.Time
	Staleness time.Duration
	Reads     map[int]Row
	Note      string // shown with a violation
	// Unplaced: the transaction read one PostgreSQL snapshot that could
	// not be placed in commit-LSN order (an uncached fallback). PostgreSQL
	// vouches for it; only the invariant and the values are checked.
	Unplaced bool
}

// Violation is a transaction the history cannot explain.
type Violation struct {
	Tx  int
	Why string
}

func (v Violation) String() string { return fmt.Sprintf("transaction %d: %s", v.Tx, v.Why) }

// Check verifies every transaction against the log. clockSlack absorbs
// the difference between the readers' clock and PostgreSQL's commit
// times (the same machine: milliseconds).
func Check(log *Log, txs []ReadTx, total int, clockSlack time.Duration) []Violation {
	sort.Slice(log.Commits, func(i, j int) bool { return log.Commits[i].LSN < log.Commits[j].LSN })
	// Per row: the LSNs at which each version began.
	type span struct {
		ver      int
		from     uint64 // the commit that wrote it (0: initial)
		balance  int
		fromTime time.Time
	}
	spans := map[int][]span{}
	for id, r := range log.Initial {
		spans[id] = []span{{ver: r.Ver, balance: r.Balance}}
	}
	for _, c := range log.Commits {
		for id, r := range c.Rows {
			spans[id] = append(spans[id], span{ver: r.Ver, from: c.LSN, balance: r.Balance, fromTime: c.Time})
		}
	}
	var out []Violation
	for i, tx := range txs {
		// Intersect, over the rows read, the LSN intervals where the value
		// read was the row's state.
		lo, hi := uint64(0), uint64(1<<64-1)
		ok := true
		sum := 0
		var detail []string
		for id, r := range tx.Reads {
			sum += r.Balance
			ss := spans[id]
			found := false
			for k, sp := range ss {
				if sp.ver != r.Ver {
					continue
				}
				found = true
				if sp.balance != r.Balance {
					out = append(out, Violation{i, fmt.Sprintf("row %d version %d read with balance %d; it was %d", id, r.Ver, r.Balance, sp.balance)})
					ok = false
				}
				end := uint64(1<<64 - 1)
				if k+1 < len(ss) {
					end = ss[k+1].from
				}
				lo, hi = max(lo, sp.from), min(hi, end)
				detail = append(detail, fmt.Sprintf("row %d v%d valid [%X, %X)", id, r.Ver, sp.from, end))
				break
			}
			if !found {
				out = append(out, Violation{i, fmt.Sprintf("row %d version %d was never committed", id, r.Ver)})
				ok = false
			}
		}
		if !ok {
			continue
		}
		if lo >= hi && !tx.Unplaced {
			sort.Strings(detail)
			out = append(out, Violation{i, fmt.Sprintf("no single snapshot explains the reads (%s) %s", strings.Join(detail, "; "), tx.Note)})
			continue
		}
		if len(tx.Reads) == len(log.Initial) && sum != total {
			out = append(out, Violation{i, fmt.Sprintf("balances sum to %d, not %d", sum, total)})
		}
		// Freshness: the latest snapshot that explains the reads, hi-1,
		// stopped being current at the commit at hi.
		if hi != 1<<64-1 && !tx.Unplaced {
			j := sort.Search(len(log.Commits), func(j int) bool { return log.Commits[j].LSN >= hi })
			if j < len(log.Commits) {
				ended := log.Commits[j].Time
				if ended.Add(clockSlack).Before(tx.Begin.Add(-tx.Staleness)) {
					out = append(out, Violation{i, fmt.Sprintf("read a snapshot replaced at %s, before begin %s minus staleness %s",
						ended.Format(time.RFC3339Nano), tx.Begin.Format(time.RFC3339Nano), tx.Staleness)})
				}
			}
		}
	}
	return out
}
