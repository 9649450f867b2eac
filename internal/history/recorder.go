package history

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync/atomic"

	"github.com/jackc/pglogrepl"
	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgproto3"
)

var recorderSeq atomic.Int64

const endPrefix = "larder.history.end"

// Recorder decodes the commits to a table accounts(id, balance, ver)
// from its own temporary logical replication slot: the history's ground
// truth, independent of the code under test.
type Recorder struct {
	url  string
	repl *pgconn.PgConn
	log  Log
	done chan error
}

// StartRecorder creates a publication and a temporary slot for table and
// reads its initial state. Start it before any writer.
func StartRecorder(ctx context.Context, url, table string) (*Recorder, error) {
	n := recorderSeq.Add(1)
	pub := fmt.Sprintf("larder_history_%d", n)
	conn, err := pgx.Connect(ctx, url)
	if err != nil {
		return nil, err
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, "CREATE PUBLICATION "+pub+" FOR TABLE "+pgx.Identifier{table}.Sanitize()); err != nil {
		return nil, fmt.Errorf("history: %w", err)
	}
	cfg, err := pgconn.ParseConfig(url)
	if err != nil {
		return nil, err
	}
	cfg.RuntimeParams["replication"] = "database"
	repl, err := pgconn.ConnectConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("history: replication connection: %w", err)
	}
	slot := pub
	res, err := pglogrepl.CreateReplicationSlot(ctx, repl, slot, "pgoutput", pglogrepl.CreateReplicationSlotOptions{Temporary: true, Mode: pglogrepl.LogicalReplication})
	if err != nil {
		repl.Close(ctx)
		return nil, fmt.Errorf("history: slot: %w", err)
	}
	start, err := pglogrepl.ParseLSN(res.ConsistentPoint)
	if err != nil {
		repl.Close(ctx)
		return nil, err
	}
	r := &Recorder{url: url, repl: repl, log: Log{Initial: map[int]Row{}}, done: make(chan error, 1)}
	rows, err := conn.Query(ctx, "SELECT id, balance, ver FROM "+pgx.Identifier{table}.Sanitize())
	if err != nil {
		repl.Close(ctx)
		return nil, err
	}
	for rows.Next() {
		var id int
		var row Row
		if err := rows.Scan(&id, &row.Balance, &row.Ver); err != nil {
			rows.Close()
			repl.Close(ctx)
			return nil, err
		}
		r.log.Initial[id] = row
	}
	rows.Close()
	err = pglogrepl.StartReplication(ctx, repl, slot, start, pglogrepl.StartReplicationOptions{
		PluginArgs: []string{"proto_version '1'", "publication_names '" + pub + "'", "messages 'true'"},
	})
	if err != nil {
		repl.Close(ctx)
		return nil, fmt.Errorf("history: start replication: %w", err)
	}
	go func() { r.done <- r.run() }()
	return r, nil
}

func (r *Recorder) run() error {
	ctx := context.Background()
	rels := map[uint32]*pglogrepl.RelationMessage{}
	var cur *Commit
	for {
		msg, err := r.repl.ReceiveMessage(ctx)
		if err != nil {
			return fmt.Errorf("history: receive: %w", err)
		}
		cd, ok := msg.(*pgproto3.CopyData)
		if !ok {
			if e, isErr := msg.(*pgproto3.ErrorResponse); isErr {
				return fmt.Errorf("history: %s", e.Message)
			}
			continue
		}
		switch cd.Data[0] {
		case pglogrepl.PrimaryKeepaliveMessageByteID:
			ka, err := pglogrepl.ParsePrimaryKeepaliveMessage(cd.Data[1:])
			if err == nil && ka.ReplyRequested {
				_ = pglogrepl.SendStandbyStatusUpdate(ctx, r.repl, pglogrepl.StandbyStatusUpdate{WALWritePosition: ka.ServerWALEnd})
			}
		case pglogrepl.XLogDataByteID:
			x, err := pglogrepl.ParseXLogData(cd.Data[1:])
			if err != nil {
				return err
			}
			m, err := pglogrepl.Parse(x.WALData)
			if err != nil {
				return err
			}
			switch m := m.(type) {
			case *pglogrepl.RelationMessage:
				rels[m.RelationID] = m
			case *pglogrepl.BeginMessage:
				cur = &Commit{LSN: uint64(m.FinalLSN), Time: m.CommitTime, Rows: map[int]Row{}}
			case *pglogrepl.UpdateMessage:
				if err := addRow(cur, rels[m.RelationID], m.NewTuple); err != nil {
					return err
				}
			case *pglogrepl.InsertMessage:
				if err := addRow(cur, rels[m.RelationID], m.Tuple); err != nil {
					return err
				}
			case *pglogrepl.CommitMessage:
				if cur != nil && len(cur.Rows) > 0 {
					r.log.Commits = append(r.log.Commits, *cur)
				}
				cur = nil
			case *pglogrepl.LogicalDecodingMessage:
				if m.Prefix == endPrefix {
					return nil
				}
			}
		}
	}
}

func addRow(c *Commit, rel *pglogrepl.RelationMessage, t *pglogrepl.TupleData) error {
	if c == nil || rel == nil || t == nil {
		return errors.New("history: a change outside a transaction or before its relation")
	}
	var id int
	var row Row
	for i, col := range t.Columns {
		if i >= len(rel.Columns) || col.DataType != pglogrepl.TupleDataTypeText {
			continue
		}
		v, err := strconv.Atoi(string(col.Data))
		if err != nil {
			continue
		}
		switch rel.Columns[i].Name {
		case "id":
			id = v
		case "balance":
			row.Balance = v
		case "ver":
			row.Ver = v
		}
	}
	c.Rows[id] = row
	return nil
}

// Finish writes an end marker into the WAL, waits until every commit
// before it is decoded, and returns the log.
func (r *Recorder) Finish(ctx context.Context) (*Log, error) {
	conn, err := pgx.Connect(ctx, r.url)
	if err != nil {
		return nil, err
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, "SELECT pg_logical_emit_message(false, $1, '')", endPrefix); err != nil {
		return nil, err
	}
	select {
	case err := <-r.done:
		r.repl.Close(context.Background())
		if err != nil {
			return nil, err
		}
		return &r.log, nil
	case <-ctx.Done():
		r.repl.Close(context.Background())
		return nil, ctx.Err()
	}
}
