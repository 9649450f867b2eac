package larder

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"
)

// Several application servers (clients of their own) missing the same key
// at once load it from PostgreSQL about once: the node holds the others'
// lookups on the first one's load lease and answers them from its put.
// Without the wait (MissWait < 0) each loads it.
func TestMissesLoadOnceAcrossClients(t *testing.T) {
	const rows, clients = 60, 4
	values := make([]string, 2*rows)
	for i := range values {
		values[i] = fmt.Sprintf("(%d, %d)", i+1, i*7)
	}
	s := startStackWith(t, "CREATE TABLE items (id int PRIMARY KEY, v int NOT NULL); ALTER TABLE items REPLICA IDENTITY FULL",
		"INSERT INTO items VALUES "+strings.Join(values, ","), "SELECT v FROM items WHERE id = $1")
	// Each run reads its own keys (ids from first): nothing the other put.
	misses := func(wait time.Duration, first int) int64 {
		var cs []*Client
		for range clients {
			cs = append(cs, s.openWith(t, []string{s.node}, 0, true, func(c *Config) { c.MissWait = wait }))
		}
		var total int64
		for id := first; id < first+rows; id++ {
			var wg sync.WaitGroup
			start := make(chan struct{})
			for _, c := range cs {
				wg.Add(1)
				go func() {
					defer wg.Done()
					<-start
					tx, err := c.BeginRO(context.Background(), 0)
					if err != nil {
						t.Error(err)
						return
					}
					defer tx.Commit(context.Background())
					var v int
					if err := tx.QueryRow(context.Background(), "SELECT v FROM items WHERE id = $1", []any{id}, &v); err != nil {
						t.Error(err)
					}
				}()
			}
			close(start)
			wg.Wait()
		}
		for _, c := range cs {
			total += c.Stats().Misses.Load()
		}
		return total
	}
	without := misses(-1, 1)
	with := misses(2*time.Second, 1+rows) // a wait long enough for a load on a loaded machine
	t.Logf("%d keys read by %d clients at once: %d loads from PostgreSQL without the wait, %d with it", rows, clients, without, with)
	if with > rows*3/2 || with >= without {
		t.Fatalf("%d loads with the wait (%d without) for %d keys: misses were not collapsed across clients", with, without, rows)
	}
}
