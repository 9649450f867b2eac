package app

import (
	"context"
	"database/sql"
	"errors"

	larder "github.com/larderdb/larder/client-lib"
)

// Cached pages (Config.Functions): ViewItem, ViewUserInfo and
// ViewBidHistory build their sections in a cacheable function of the item
// or user id (larder.SQLFunction), so a page whose data did not change is
// one cache entry — one cache-node round trip — instead of one per query.
// The function's entry takes the tags of every query it ran.

// pageBody builds a page's sections from an id.
type pageBody func(q *req, tx *sql.Tx, id int) error

// statusError carries a page's HTTP status out of a cached function (not
// found: the function fails, and nothing is cached).
type statusError struct {
	status int
	msg    string
}

func (e *statusError) Error() string { return e.msg }

// pageFunction makes the cacheable function of a page body.
func pageFunction(name string, body pageBody) *larder.SQLFunction[int, []section] {
	return larder.NewSQLFunction(name, func(ctx context.Context, tx *sql.Tx, id int) ([]section, error) {
		q := &req{ctx: ctx}
		if err := body(q, tx, id); err != nil {
			if q.status != 0 {
				return nil, &statusError{status: q.status, msg: err.Error()}
			}
			return nil, err
		}
		return q.page.Sections, nil
	})
}

// readPage runs a page body in a read-only transaction: through its
// cacheable function when Config.Functions, else query by query.
func (a *App) readPage(q *req, fn *larder.SQLFunction[int, []section], body pageBody, id int) error {
	if !a.cfg.Functions {
		return a.read(q, func(tx *sql.Tx) error { return body(q, tx, id) })
	}
	const attempts = 3
	for i := 1; ; i++ {
		err := a.readPageOnce(q, fn, id)
		if i == attempts || !errors.Is(err, larder.ErrRetry) {
			return err
		}
	}
}

func (a *App) readPageOnce(q *req, fn *larder.SQLFunction[int, []section], id int) error {
	ctx := a.cfg.ReadContext(q.ctx)
	conn, err := a.cfg.DB.Conn(ctx)
	if err != nil {
		return err
	}
	defer conn.Close()
	tx, err := conn.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
	if err != nil {
		return err
	}
	sections, err := fn.Call(ctx, conn, tx, id)
	if cerr := tx.Commit(); err == nil {
		err = cerr
	}
	var se *statusError
	if errors.As(err, &se) {
		q.status = se.status
		return errors.New(se.msg)
	}
	if err != nil {
		return err
	}
	q.page.Sections = append(q.page.Sections, sections...)
	return nil
}
