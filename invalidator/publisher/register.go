package publisher

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/larderdb/larder/internal/invalidation"
	"github.com/larderdb/larder/internal/tags"
)

// RegisterPrefix is the prefix of the transactional logical decoding
// message by which a tag column set registration takes effect: Register
// commits it, and the sets are published for every commit decoded after
// the message's own (its commit LSN is their effective LSN).
const RegisterPrefix = "larder.tagsets"

// registerPayload is the message's content (JSON).
type registerPayload struct {
	V    int                   `json:"v"`
	ID   string                `json:"id"` // the waiting Register call's, if any
	Sets map[string][][]string `json:"sets"`
}

// registeredSet is a set registered at run time, kept in the KV bucket.
type registeredSet struct {
	Table   string   `json:"table"`
	Columns []string `json:"columns"`
	From    uint64   `json:"from"` // the effective LSN
}

// registry holds the sets registered at run time, loaded from the KV
// bucket when a session starts and added to as registrations are decoded.
type registry struct {
	mu      sync.Mutex
	byTable map[string][]registeredSet
	count   int
	waiters map[string]chan registerOutcome
}

// registerOutcome is what the decoder tells the waiting Register call.
type registerOutcome struct {
	effective uint64
	refused   map[string]string
	err       error
}

// registerStoreTimeout bounds the wait for the KV bucket to store a set.
const registerStoreTimeout = 5 * time.Second

// RegisterTimeout bounds the wait for a registration's message to be
// decoded and applied.
var RegisterTimeout = 30 * time.Second

// registeredKey is a set's key in the bucket: a hash (names may hold any
// character; keys may not).
func registeredKey(table string, columns []string) string {
	h := sha256.Sum256([]byte(invalidation.SetName(table, columns)))
	return hex.EncodeToString(h[:16])
}

// openRegistry opens (creating it) the bucket and loads every set in it.
func (p *Publisher) openRegistry(ctx context.Context) error {
	storage := jetstream.FileStorage
	if p.cfg.StreamMemory {
		storage = jetstream.MemoryStorage
	}
	kv, err := p.js.CreateOrUpdateKeyValue(ctx, jetstream.KeyValueConfig{
		Bucket:      invalidation.TagSetsBucket(p.cfg.SubjectPrefix),
		Description: "Larder tag column sets registered at run time, with their effective LSNs",
		Storage:     storage,
	})
	if err != nil {
		return fmt.Errorf("publisher: tag sets bucket: %w", err)
	}
	keys, err := kv.Keys(ctx)
	if err != nil && !errors.Is(err, jetstream.ErrNoKeysFound) {
		return fmt.Errorf("publisher: list registered tag sets: %w", err)
	}
	byTable := map[string][]registeredSet{}
	count := 0
	for _, k := range keys {
		e, err := kv.Get(ctx, k)
		if err != nil {
			if errors.Is(err, jetstream.ErrKeyNotFound) {
				continue
			}
			return fmt.Errorf("publisher: read registered tag set %s: %w", k, err)
		}
		var s registeredSet
		if err := json.Unmarshal(e.Value(), &s); err != nil || s.Table == "" || len(s.Columns) == 0 {
			// A set that cannot be read would not be published, but a node
			// may hold results keyed on it: no session starts without it.
			return fmt.Errorf("publisher: registered tag set %s in bucket %s is unreadable (%v); delete the entry and restart the cache-nodes", k, invalidation.TagSetsBucket(p.cfg.SubjectPrefix), err)
		}
		byTable[s.Table] = append(byTable[s.Table], s)
		count++
	}
	for _, sets := range byTable {
		sort.Slice(sets, func(i, j int) bool { return sets[i].From < sets[j].From })
	}
	p.reg.mu.Lock()
	p.reg.byTable, p.reg.count = byTable, count
	p.reg.mu.Unlock()
	p.kv = kv
	p.m.registeredSets.Set(float64(count))
	return nil
}

// chooseSets sets each table's tag column sets: the QUMA file's (or the
// table's keys), then the sets registered at run time.
func (p *Publisher) chooseSets(tables map[string]*tableInfo) {
	chooseSets(tables, p.cfg.TagColumns)
	p.reg.mu.Lock()
	defer p.reg.mu.Unlock()
	for name, regs := range p.reg.byTable {
		t := tables[name]
		if t == nil {
			continue
		}
		for _, r := range regs {
			if !containsSet(t.sets, r.Columns) {
				t.sets = append(slices.Clip(t.sets), r.Columns)
			}
		}
	}
}

// setsOf returns the sets to publish for a table not in p.tables (a
// relation decoded before the catalog knew it).
func (p *Publisher) setsOf(name string) [][]string {
	var sets [][]string
	if p.cfg.TagColumns != nil {
		sets = p.cfg.TagColumns[name]
	}
	p.reg.mu.Lock()
	defer p.reg.mu.Unlock()
	for _, r := range p.reg.byTable[name] {
		if !containsSet(sets, r.Columns) {
			sets = append(slices.Clip(sets), r.Columns)
		}
	}
	return sets
}

// registeredFrom returns the effective LSN of every registered set, by
// SetName.
func (p *Publisher) registeredFrom() map[string]uint64 {
	p.reg.mu.Lock()
	defer p.reg.mu.Unlock()
	if p.reg.count == 0 {
		return nil
	}
	from := make(map[string]uint64, p.reg.count)
	for name, regs := range p.reg.byTable {
		for _, r := range regs {
			from[invalidation.SetName(name, r.Columns)] = r.From
		}
	}
	return from
}

func containsSet(sets [][]string, set []string) bool {
	return slices.ContainsFunc(sets, func(s []string) bool { return slices.Equal(s, set) })
}

// Register asks the publisher to publish keyed tags for more tag column
// sets. Sets already published are left alone; a table the publisher
// does not cover, a column the table lacks, or a column outside the
// table's replica identity (unless FixReplicaIdentity, which then sets the
// identity to FULL) refuses that set, with the reason. The others are
// published for every commit after the registration's own, whose LSN is
// the answer's Effective; before answering, that LSN is the stream's
// last epoch (cache-nodes count no group's history complete from before
// it) and the sets are in the KV bucket, so they outlive restarts.
func (p *Publisher) Register(ctx context.Context, req invalidation.TagSetsRegistration) (invalidation.TagSetsRegistered, error) {
	var out invalidation.TagSetsRegistered
	published := p.TagSets()
	if published == nil {
		return out, errors.New("publisher: not replicating yet; ask again")
	}
	out.Refused = map[string]string{}
	want := map[string][][]string{}
	for table, sets := range req.Sets {
		for _, set := range sets {
			name := invalidation.SetName(table, set)
			have, covered := published[table]
			switch {
			case !covered:
				out.Refused[name] = "table " + table + " is not covered by the invalidator (not in its publication, or does not exist)"
			case containsSet(have, set):
			case containsSet(want[table], set):
			default:
				want[table] = append(want[table], set)
			}
		}
	}
	if len(want) == 0 {
		return p.registered(out, 0), nil
	}
	p.reg.mu.Lock()
	full := p.reg.count+countSets(want) > invalidation.MaxRegisteredSets
	p.reg.mu.Unlock()
	if full {
		return out, fmt.Errorf("publisher: more than %d registered tag column sets; refusing more", invalidation.MaxRegisteredSets)
	}
	if err := p.checkRegistration(ctx, want, &out); err != nil {
		return out, err
	}
	if len(want) == 0 {
		return p.registered(out, 0), nil
	}

	id := rand.Text()
	done := make(chan registerOutcome, 1)
	p.reg.mu.Lock()
	if p.reg.waiters == nil {
		p.reg.waiters = map[string]chan registerOutcome{}
	}
	p.reg.waiters[id] = done
	p.reg.mu.Unlock()
	defer func() {
		p.reg.mu.Lock()
		delete(p.reg.waiters, id)
		p.reg.mu.Unlock()
	}()
	payload, _ := json.Marshal(registerPayload{V: 1, ID: id, Sets: want})
	p.connMu.Lock()
	conn := p.conn
	var err error
	if conn == nil {
		err = errors.New("not connected")
	} else {
		_, err = conn.Exec(ctx, `SELECT pg_logical_emit_message(true, $1, $2::text)`, RegisterPrefix, string(payload))
	}
	p.connMu.Unlock()
	if err != nil {
		return out, fmt.Errorf("publisher: commit the registration: %w", err)
	}
	wctx, cancel := context.WithTimeout(ctx, RegisterTimeout)
	defer cancel()
	select {
	case o := <-done:
		if o.err != nil {
			return out, o.err
		}
		for k, v := range o.refused {
			out.Refused[k] = v
		}
		return p.registered(out, o.effective), nil
	case <-wctx.Done():
		return out, fmt.Errorf("publisher: the registration was committed but not decoded in %s (it takes effect when it is): %w", RegisterTimeout, wctx.Err())
	}
}

// registered completes an answer with its effective LSN and the reply.
func (p *Publisher) registered(out invalidation.TagSetsRegistered, effective uint64) invalidation.TagSetsRegistered {
	out.Effective = effective
	out.Reply = p.TagSetsReply()
	if len(out.Refused) == 0 {
		out.Refused = nil
	}
	return out
}

func countSets(m map[string][][]string) int {
	n := 0
	for _, sets := range m {
		n += len(sets)
	}
	return n
}

// checkRegistration reads the tables' columns and replica identities and
// removes from want the sets it refuses (recorded in out.Refused); with
// FixReplicaIdentity it sets the identity of a table whose identity
// lacks a wanted set's columns to FULL first.
func (p *Publisher) checkRegistration(ctx context.Context, want map[string][][]string, out *invalidation.TagSetsRegistered) error {
	published := p.TagSets()
	conn, err := pgx.Connect(ctx, p.cfg.ConnString)
	if err != nil {
		return fmt.Errorf("publisher: registration: connect: %w", err)
	}
	defer conn.Close(context.Background())
	for table, sets := range want {
		var quoted string
		var identity string
		var columns, idCols []string
		err := conn.QueryRow(ctx, `
SELECT format('%I.%I', n.nspname, c.relname), c.relreplident::text,
  coalesce((SELECT array_agg(a.attname::text) FROM pg_attribute a WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped), '{}'),
  coalesce((SELECT array_agg(a.attname::text)
     FROM pg_index i CROSS JOIN LATERAL unnest(i.indkey) AS k(attnum)
     JOIN pg_attribute a ON a.attrelid = c.oid AND a.attnum = k.attnum
     WHERE i.indrelid = c.oid AND ((c.relreplident = 'd' AND i.indisprimary) OR (c.relreplident = 'i' AND i.indisreplident))), '{}')
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = split_part($1, '.', 1) AND c.relname = substr($1, length(split_part($1, '.', 1)) + 2)`, table).Scan(&quoted, &identity, &columns, &idCols)
		if errors.Is(err, pgx.ErrNoRows) {
			for _, set := range sets {
				out.Refused[invalidation.SetName(table, set)] = "table " + table + " does not exist"
			}
			delete(want, table)
			continue
		}
		if err != nil {
			return fmt.Errorf("publisher: registration: read %s: %w", table, err)
		}
		var kept [][]string
		lacking := false
		for _, set := range sets {
			name := invalidation.SetName(table, set)
			if c := firstMissing(tableColumns(set), columns); c != "" {
				out.Refused[name] = "table " + table + " has no column " + c
				continue
			}
			if tags.IsDerivedSet(set) {
				if why := checkDerived(ctx, conn, table, set, published); why != "" {
					out.Refused[name] = why
					continue
				}
			}
			if identity != "f" && firstMissing(tableColumns(set), idCols) != "" {
				lacking = true
			}
			kept = append(kept, set)
		}
		if lacking {
			fix := fmt.Sprintf("ALTER TABLE %s REPLICA IDENTITY FULL;", quoted)
			if !p.cfg.FixReplicaIdentity {
				for _, set := range kept {
					if firstMissing(tableColumns(set), idCols) != "" {
						out.Refused[invalidation.SetName(table, set)] = fmt.Sprintf("the replica identity of %s (%s) lacks columns of the set: UPDATEs would not give their old values; run %s or start the invalidator with --fix-replica-identity", table, strings.Join(idCols, ", "), fix)
					}
				}
				kept = slices.DeleteFunc(kept, func(set []string) bool { return firstMissing(tableColumns(set), idCols) != "" })
			} else {
				if _, err := conn.Exec(ctx, fix); err != nil {
					return fmt.Errorf("publisher: registration: %s: %w", fix, err)
				}
				p.cfg.Log.Info("replica identity set to FULL for a registered tag column set", "statement", strings.TrimSuffix(fix, ";"))
				out.Warnings = append(out.Warnings, "ran "+fix)
			}
		}
		if len(kept) == 0 {
			delete(want, table)
		} else {
			want[table] = kept
		}
	}
	return nil
}

// firstMissing returns the first column of set not in have ("" if none).
func firstMissing(set, have []string) string {
	for _, c := range set {
		if !slices.Contains(have, c) {
			return c
		}
	}
	return ""
}

// registerMessage records a registration decoded inside the open
// transaction; applied at its commit.
func (p *Publisher) registerMessage(content []byte) {
	var r registerPayload
	if err := json.Unmarshal(content, &r); err != nil || r.V != 1 {
		p.cfg.Log.Error("unreadable tag set registration message: ignored (nothing is published under it)", "err", err, "payload", string(content))
		return
	}
	p.regs = append(p.regs, r)
}

// applyRegistrations publishes the sets of the transaction's
// registrations from its commit LSN on: into the KV bucket first (a crash
// before that replays the registration from the slot), then the tables'
// and relations' sets, then an epoch at the commit, acknowledged, and
// only then the answer to the Register call.
func (p *Publisher) applyRegistrations(ctx context.Context, commit uint64) error {
	regs := p.regs
	p.regs = p.regs[:0]
	for _, r := range regs {
		refused := map[string]string{}
		added := 0
		for table, sets := range r.Sets {
			t := p.tables[table]
			for _, set := range sets {
				name := invalidation.SetName(table, set)
				if t == nil {
					refused[name] = "table " + table + " is no longer covered"
					continue
				}
				if containsSet(t.sets, set) {
					continue
				}
				s := registeredSet{Table: table, Columns: set, From: commit}
				b, _ := json.Marshal(&s)
				if p.kv == nil {
					refused[name] = "the invalidator has no KV bucket to keep it in"
					continue
				}
				pctx, cancel := context.WithTimeout(ctx, registerStoreTimeout)
				_, err := p.kv.Put(pctx, registeredKey(table, set), b)
				cancel()
				if err != nil {
					// Not kept, not published: a restart would forget it.
					// Replication goes on; the client may ask again.
					p.m.registrations.WithLabelValues("not_stored").Inc()
					p.cfg.Log.Error("could not keep a registered tag column set; not published", "set", name, "bucket", invalidation.TagSetsBucket(p.cfg.SubjectPrefix), "err", err)
					refused[name] = "the invalidator could not keep it in its KV bucket: " + err.Error()
					continue
				}
				p.reg.mu.Lock()
				p.reg.byTable[table] = append(p.reg.byTable[table], s)
				p.reg.count++
				p.reg.mu.Unlock()
				t.sets = append(slices.Clip(t.sets), set)
				added++
				p.cfg.Log.Info("tag column set registered", "set", name, "effective_lsn", fmt.Sprintf("%X", commit))
			}
			for id, rel := range p.relations {
				if rel.name == table && t != nil && !equalSets(rel.given, t.sets) {
					p.relations[id] = rel.withSets(t.sets)
				}
			}
		}
		if added > 0 {
			// Derived sets are indexed before anything is published under
			// them; the commits after the registration's up to the index's
			// snapshot publish their set tags.
			p.syncDerived()
			p.loadDerived(ctx, "registration")
			p.m.registrations.WithLabelValues("registered").Add(float64(added))
			p.reg.mu.Lock()
			p.m.registeredSets.Set(float64(p.reg.count))
			p.reg.mu.Unlock()
			// The epoch is stored before any client can learn of the
			// set (noteSets updates the tag sets reply): a node that
			// confirms a group of it reads an epoch at or after E.
			if err := p.publishEpoch(ctx, commit); err != nil {
				return err
			}
			p.noteSets()
			// Clients ask for the tag sets again on a schema change
			// notice: every client picks the new sets up at once.
			notice := invalidation.SchemaChange{CommitLSN: commit}
			if err := p.cfg.NATS.Publish(invalidation.SchemaChangedSubject(p.cfg.SubjectPrefix), notice.Append(nil)); err != nil {
				p.cfg.Log.Warn("publish the notice of registered tag sets", "err", err)
			}
		}
		p.reg.mu.Lock()
		done := p.reg.waiters[r.ID]
		p.reg.mu.Unlock()
		if done != nil {
			effective := commit
			if added == 0 {
				effective = 0
			}
			done <- registerOutcome{effective: effective, refused: refused}
		}
	}
	return nil
}
