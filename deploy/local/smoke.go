package main

import (
	"context"
	"fmt"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/redis/go-redis/v9"

	"github.com/larderdb/larder/internal/invalidation"
)

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
}

// Smoke exercises each server for real: a write and read in PostgreSQL, an
// acknowledged JetStream publish, a Redis INCR.
func (s *Stack) Smoke(ctx context.Context) (SmokeReport, error) {
	var r SmokeReport
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()

	nc, err := nats.Connect(s.NATS.URL(), nats.Timeout(5*time.Second))
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
	if _, err := conn.Exec(ctx, "CREATE TABLE IF NOT EXISTS larder_demo (id bigserial PRIMARY KEY, at timestamptz NOT NULL DEFAULT now())"); err != nil {
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
	// The pincushion keeps pins; ask for the list.
	for len(r.Pins) == 0 {
		reply, err := nc.RequestWithContext(ctx, invalidation.PinListSubject(invalidation.DefaultPrefix), nil)
		if err != nil {
			return r, fmt.Errorf("smoke: pin list: %w", err)
		}
		if r.Pins, err = invalidation.DecodePinList(reply.Data); err != nil {
			return r, fmt.Errorf("smoke: pin list: %w", err)
		}
		if len(r.Pins) == 0 {
			time.Sleep(100 * time.Millisecond)
		}
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
