package service

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/nats-io/nats.go"

	"github.com/larderdb/larder/internal/invalidation"
	"github.com/larderdb/larder/internal/testenv"
)

// A client that finds no pin recent enough (right after its session
// wrote) asks the pincushion to verify a snapshot of its own; the
// request also makes the pincushion take a pin at once, so that the
// session's next transactions find one instead of asking again. The pin
// interval here is 10 s: a pin within a few seconds of the request can
// only be the request's.
func TestVerifyRequestBringsAPin(t *testing.T) {
	url := testenv.Database(t, env.PG)
	ctx := context.Background()
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, `CREATE TABLE items (id int PRIMARY KEY, name text)`); err != nil {
		t.Fatal(err)
	}
	nc, err := nats.Connect(env.NATS.URL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	announced := make(chan *nats.Msg, 64)
	if _, err := nc.ChanSubscribe(invalidation.PinAnnounceSubject("demand"), announced); err != nil {
		t.Fatal(err)
	}
	o := Defaults()
	o.PG, o.NATS, o.Prefix, o.Slot, o.Publication = url, env.NATS.URL(), "demand", "demand", "demand"
	o.Heartbeat, o.PinInterval = 20*time.Millisecond, 10*time.Second
	o.StreamMemory, o.Metrics = true, ""
	rctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- Run(rctx, o, slog.New(slog.NewTextHandler(testWriter{t}, nil))) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("service: %v", err)
		}
	}()
	next := func(what string, within time.Duration) invalidation.Pin {
		t.Helper()
		select {
		case m := <-announced:
			p, err := invalidation.DecodePin(m.Data)
			if err != nil {
				t.Fatal(err)
			}
			return p
		case <-time.After(within):
			t.Fatalf("no pin announced %s", what)
		}
		return invalidation.Pin{}
	}
	first := next("at start", 30*time.Second)
	// Nothing asks: no other pin comes (the cushion's own verification of
	// its candidates is not a request).
	select {
	case m := <-announced:
		p, _ := invalidation.DecodePin(m.Data)
		t.Fatalf("a pin at %X was taken with nobody asking", p.LSN)
	case <-time.After(time.Second):
	}

	// The session writes, then takes a snapshot and asks for it to be
	// verified, as client-lib does when no pin is recent enough.
	var written string
	if err := conn.QueryRow(ctx, `INSERT INTO items VALUES (1, 'pen') RETURNING pg_current_wal_insert_lsn()::text`).Scan(&written); err != nil {
		t.Fatal(err)
	}
	wlsn, err := pglogrepl.ParseLSN(written)
	if err != nil {
		t.Fatal(err)
	}
	var req invalidation.PinVerifyRequest
	var xmin, xmax int64
	var xip []int64
	var insert string
	err = pgx.BeginTxFunc(ctx, conn, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly}, func(tx pgx.Tx) error {
		return tx.QueryRow(ctx, `SELECT pg_snapshot_xmin(s)::text::bigint, pg_snapshot_xmax(s)::text::bigint,
  ARRAY(SELECT x::text::bigint FROM pg_snapshot_xip(s) x ORDER BY 1), pg_current_wal_insert_lsn()::text
FROM pg_current_snapshot() s`).Scan(&xmin, &xmax, &xip, &insert)
	})
	if err != nil {
		t.Fatal(err)
	}
	ilsn, err := pglogrepl.ParseLSN(insert)
	if err != nil {
		t.Fatal(err)
	}
	req.Xmin, req.Xmax, req.InsertLSN = uint64(xmin), uint64(xmax), uint64(ilsn)
	for _, x := range xip {
		req.Xip = append(req.Xip, uint64(x))
	}
	msg, err := nc.Request(invalidation.PinVerifySubject("demand"), invalidation.EncodePinVerifyRequest(req), 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if reply, err := invalidation.DecodePinVerifyReply(msg.Data); err != nil || !reply.OK {
		t.Fatalf("verify: %+v, %v", reply, err)
	}
	pin := next("within 5 s of the verify request", 5*time.Second)
	if pin.LSN <= first.LSN || pin.LSN < uint64(wlsn) {
		t.Fatalf("the demanded pin at %X is not after the write at %X (first pin %X)", pin.LSN, uint64(wlsn), first.LSN)
	}
}
