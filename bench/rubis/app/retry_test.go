package app

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"sync/atomic"
	"testing"

	larder "github.com/larderdb/larder/client-lib"
)

// retryDriver's transactions fail to commit with larder.ErrRetry the
// first failures times.
type retryDriver struct{ failures, commits atomic.Int32 }

func (d *retryDriver) Open(string) (driver.Conn, error) { return retryConn{d}, nil }

type retryConn struct{ d *retryDriver }

func (c retryConn) Prepare(string) (driver.Stmt, error) { return nil, errors.New("not supported") }
func (c retryConn) Close() error                        { return nil }
func (c retryConn) Begin() (driver.Tx, error)           { return retryTx(c), nil }
func (c retryConn) BeginTx(context.Context, driver.TxOptions) (driver.Tx, error) {
	return retryTx(c), nil
}

type retryTx struct{ d *retryDriver }

func (t retryTx) Commit() error {
	t.d.commits.Add(1)
	if t.d.failures.Add(-1) >= 0 {
		return larder.ErrRetry
	}
	return nil
}
func (t retryTx) Rollback() error { return nil }

// A read-only interaction that Larder asks to retry starts over, with the
// first attempt's output dropped; a third refusal is the answer.
func TestReadRetriesErrRetry(t *testing.T) {
	d := &retryDriver{}
	sql.Register("rubis-retry-test", d)
	db, err := sql.Open("rubis-retry-test", "")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	a := &App{cfg: Config{DB: db, ReadContext: func(ctx context.Context) context.Context { return ctx }}}
	q := &req{ctx: context.Background(), page: page{Sections: []section{{Title: "before"}}}}
	body := func(*sql.Tx) error {
		q.page.Sections = append(q.page.Sections, section{Title: "read"})
		return nil
	}
	d.failures.Store(1)
	if err := a.read(q, body); err != nil {
		t.Fatal(err)
	}
	if d.commits.Load() != 2 || len(q.page.Sections) != 2 || q.page.Sections[1].Title != "read" {
		t.Fatalf("%d commits, sections %+v", d.commits.Load(), q.page.Sections)
	}
	d.failures.Store(5)
	if err := a.read(q, body); !errors.Is(err, larder.ErrRetry) {
		t.Fatalf("three refusals: %v", err)
	}
}
