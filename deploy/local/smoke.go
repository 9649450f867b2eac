package main

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/go-redis/v9"

	"github.com/larderdb/larder/cache-node/protocol"
	"github.com/larderdb/larder/cache-node/store"
	larder "github.com/larderdb/larder/client-lib"
	"github.com/larderdb/larder/internal/invalidation"
)

// demoTableDDL is the demo's table.
const demoTableDDL = "CREATE TABLE IF NOT EXISTS larder_demo (id bigserial PRIMARY KEY, at timestamptz NOT NULL DEFAULT now())"

// SmokeReport is what a smoke check of the stack saw.
type SmokeReport struct {
	PostgresVersion string // server_version
	WALLevel        string // must be "logical" for the invalidator
	DemoRows        int64  // rows in larder_demo after this check's insert: grows across restarts
	JetStreamSeq    uint64 // sequence JetStream acknowledged for this check's message
	RedisRuns       int64  // a counter kept in Redis: grows across restarts

	// The invalidator's answer to this check's insert: the table tag of
	// larder_demo arrived on its NATS subject.
	InvalidationLSN   string        // the insert's commit LSN
	InvalidationDelay time.Duration // from COMMIT returning to the message arriving
	Pins              []invalidation.Pin

	// The cache-node: count(*) of larder_demo computed at the newest pin,
	// put, served; then ended by an insert.
	CachedCount        string
	CachedLo, CachedHi uint64 // the served interval after the insert
	EndedBy            uint64 // the insert's commit LSN (at most; WAL position after it)
	NewerMiss          string // the miss class of a lookup after the insert

	// database/sql through the larder driver: count(*) in a read-only
	// transaction, then again after an INSERT through the driver (read your
	// writes: the second count includes it).
	DriverCounts [2]int64

	// Overlay: with two cache-nodes or more, a key the second masters read
	// through the first (overlaydemo.go); nil with one node.
	Overlay *OverlayDemo
}

// Smoke exercises each server for real: a write and read in PostgreSQL, an
// acknowledged JetStream publish, a Redis INCR.
func (s *Stack) Smoke(ctx context.Context) (SmokeReport, error) {
	var r SmokeReport
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()

	// The operator's check uses the invalidator's credentials: its role may
	// read every subject and make the smoke stream.
	natsOpts, err := s.Creds.natsOptions(invalidation.RoleInvalidator)
	if err != nil {
		return r, err
	}
	nc, err := nats.Connect(s.NATS.URL(), append(natsOpts, nats.Timeout(5*time.Second))...)
	if err != nil {
		return r, fmt.Errorf("smoke: NATS: %w", err)
	}
	defer nc.Close()
	// The invalidator is replicating once a heartbeat arrives.
	hb, err := nc.SubscribeSync(invalidation.HeartbeatSubject(invalidation.DefaultPrefix))
	if err != nil {
		return r, fmt.Errorf("smoke: NATS: %w", err)
	}
	if _, err := hb.NextMsgWithContext(ctx); err != nil {
		return r, fmt.Errorf("smoke: no heartbeat from the invalidator: %w", err)
	}
	_ = hb.Unsubscribe()
	inv, err := nc.SubscribeSync(invalidation.TagSubject(invalidation.DefaultPrefix, "public.larder_demo"))
	if err != nil {
		return r, fmt.Errorf("smoke: NATS: %w", err)
	}
	defer inv.Unsubscribe()

	conn, err := pgx.Connect(ctx, s.PG.URL("postgres"))
	if err != nil {
		return r, fmt.Errorf("smoke: PostgreSQL: %w", err)
	}
	defer conn.Close(context.Background())
	if err := conn.QueryRow(ctx, "SELECT current_setting('server_version'), current_setting('wal_level')").Scan(&r.PostgresVersion, &r.WALLevel); err != nil {
		return r, fmt.Errorf("smoke: PostgreSQL: %w", err)
	}
	if _, err := conn.Exec(ctx, demoTableDDL); err != nil {
		return r, fmt.Errorf("smoke: PostgreSQL: %w", err)
	}
	if err := conn.QueryRow(ctx, "WITH ins AS (INSERT INTO larder_demo DEFAULT VALUES RETURNING 1) SELECT (SELECT count(*) FROM larder_demo) + (SELECT count(*) FROM ins)").Scan(&r.DemoRows); err != nil {
		return r, fmt.Errorf("smoke: PostgreSQL: %w", err)
	}
	committed := time.Now()
	for r.InvalidationLSN == "" {
		m, err := inv.NextMsgWithContext(ctx)
		if err != nil {
			return r, fmt.Errorf("smoke: no invalidation for the insert into larder_demo: %w", err)
		}
		d, err := invalidation.Decode(m.Data)
		if err != nil {
			return r, fmt.Errorf("smoke: invalidation: %w", err)
		}
		if d.Txn != nil {
			r.InvalidationDelay = time.Since(committed)
			r.InvalidationLSN = pglogrepl.LSN(d.Txn.CommitLSN).String()
		}
	}
	// The pincushion keeps pins; wait for one taken after the insert.
	insertLSN, err := pglogrepl.ParseLSN(r.InvalidationLSN)
	if err != nil {
		return r, err
	}
	for len(r.Pins) == 0 || r.Pins[len(r.Pins)-1].LSN < uint64(insertLSN) {
		reply, err := nc.RequestWithContext(ctx, invalidation.PinListSubject(invalidation.DefaultPrefix), nil)
		if err != nil {
			return r, fmt.Errorf("smoke: pin list: %w", err)
		}
		if r.Pins, err = invalidation.DecodePinList(reply.Data); err != nil {
			return r, fmt.Errorf("smoke: pin list: %w", err)
		}
		if len(r.Pins) == 0 || r.Pins[len(r.Pins)-1].LSN < uint64(insertLSN) {
			time.Sleep(50 * time.Millisecond)
		}
	}

	if err := s.cacheRoundTrip(ctx, conn, &r); err != nil {
		return r, err
	}
	if err := s.overlayRoundTrip(ctx, &r); err != nil {
		return r, err
	}
	if err := s.driverRoundTrip(ctx, &r); err != nil {
		return r, err
	}

	js, err := jetstream.New(nc)
	if err != nil {
		return r, fmt.Errorf("smoke: NATS: %w", err)
	}
	if _, err := js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{Name: "LARDER_SMOKE", Subjects: []string{"larder.smoke"}, MaxMsgs: 100}); err != nil {
		return r, fmt.Errorf("smoke: JetStream: %w", err)
	}
	ack, err := js.Publish(ctx, "larder.smoke", []byte(time.Now().UTC().Format(time.RFC3339Nano)))
	if err != nil {
		return r, fmt.Errorf("smoke: JetStream publish: %w", err)
	}
	r.JetStreamSeq = ack.Sequence

	opts, err := redis.ParseURL(s.Redis.URL())
	if err != nil {
		return r, fmt.Errorf("smoke: Redis: %w", err)
	}
	rc := redis.NewClient(opts)
	defer rc.Close()
	if r.RedisRuns, err = rc.Incr(ctx, "larder:smoke:runs").Result(); err != nil {
		return r, fmt.Errorf("smoke: Redis: %w", err)
	}
	return r, nil
}

// cacheRoundTrip computes a result at the newest pin, puts it into the
// cache-node, reads it back, then inserts a row and shows the node ended
// it there.
func (s *Stack) cacheRoundTrip(ctx context.Context, conn *pgx.Conn, r *SmokeReport) error {
	pin := r.Pins[len(r.Pins)-1]
	err := pgx.BeginTxFunc(ctx, conn, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, "SET TRANSACTION SNAPSHOT '"+pin.SnapshotID+"'"); err != nil {
			return err
		}
		return tx.QueryRow(ctx, "SELECT count(*)::text FROM larder_demo").Scan(&r.CachedCount)
	})
	if err != nil {
		return fmt.Errorf("smoke: read at the pin: %w", err)
	}
	tlsCfg, err := s.Creds.clientTLS()
	if err != nil {
		return err
	}
	cl := protocol.NewTLSClient(s.CacheNodeAddr(), 1, tlsCfg)
	defer cl.Close()
	key := []byte("larder-demo-count")
	dep := store.Dep{Tag: "public.larder_demo", Table: "public.larder_demo"} // count(*) reads no column
	if err := cl.Put(ctx, &protocol.PutRequest{Key: key, Snapshot: pin.LSN, Deps: []store.Dep{dep}, Value: []byte(r.CachedCount)}); err != nil {
		return fmt.Errorf("smoke: cache-node put: %w", err)
	}
	for {
		res, err := cl.Lookup(ctx, &protocol.LookupRequest{Key: key, TMin: pin.LSN, TMax: pin.LSN})
		if err != nil {
			return fmt.Errorf("smoke: cache-node lookup: %w", err)
		}
		if res.Miss == store.Hit {
			break
		}
		if ctx.Err() != nil {
			return fmt.Errorf("smoke: the cache-node never served the put: %w", ctx.Err())
		}
		time.Sleep(10 * time.Millisecond)
	}
	var walText string
	if err := conn.QueryRow(ctx, "WITH ins AS (INSERT INTO larder_demo DEFAULT VALUES RETURNING 1) SELECT pg_current_wal_lsn()::text FROM ins").Scan(&walText); err != nil {
		return fmt.Errorf("smoke: insert: %w", err)
	}
	if err := conn.QueryRow(ctx, "SELECT pg_current_wal_lsn()::text").Scan(&walText); err != nil {
		return fmt.Errorf("smoke: %w", err)
	}
	wal, err := pglogrepl.ParseLSN(walText)
	if err != nil {
		return err
	}
	r.EndedBy = uint64(wal)
	for {
		st, err := cl.Stats(ctx)
		if err != nil {
			return fmt.Errorf("smoke: cache-node stats: %w", err)
		}
		if st.Watermark >= uint64(wal) {
			break
		}
		if ctx.Err() != nil {
			return fmt.Errorf("smoke: the cache-node's watermark never passed the insert: %w", ctx.Err())
		}
		time.Sleep(10 * time.Millisecond)
	}
	res, err := cl.Lookup(ctx, &protocol.LookupRequest{Key: key, TMin: pin.LSN, TMax: pin.LSN})
	if err != nil || res.Miss != store.Hit || res.Open {
		return fmt.Errorf("smoke: after the insert the cached count should be served, ended, at the pin: %+v %v", res, err)
	}
	r.CachedLo, r.CachedHi = res.Lo, res.Hi
	res, err = cl.Lookup(ctx, &protocol.LookupRequest{Key: key, TMin: uint64(wal), TMax: uint64(wal) + 1})
	if err != nil || res.Miss == store.Hit {
		return fmt.Errorf("smoke: the cached count was served after the insert: %+v %v", res, err)
	}
	r.NewerMiss = res.Miss.String()
	return nil
}

// driverRoundTrip reads through client-lib's database/sql driver with the
// stack's DSN, as an application would.
func (s *Stack) driverRoundTrip(ctx context.Context, r *SmokeReport) error {
	db, err := sql.Open(larder.DriverName, s.DSN())
	if err != nil {
		return fmt.Errorf("smoke: larder driver: %w", err)
	}
	defer db.Close()
	for i := range r.DriverCounts {
		if i == 1 {
			if _, err := db.ExecContext(ctx, "INSERT INTO larder_demo DEFAULT VALUES"); err != nil {
				return fmt.Errorf("smoke: larder driver: %w", err)
			}
		}
		tx, err := db.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
		if err != nil {
			return fmt.Errorf("smoke: larder driver: %w", err)
		}
		err = tx.QueryRowContext(ctx, "SELECT count(*) FROM larder_demo").Scan(&r.DriverCounts[i])
		_ = tx.Commit()
		if err != nil {
			return fmt.Errorf("smoke: larder driver: %w", err)
		}
	}
	return nil
}
