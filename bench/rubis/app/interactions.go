package app

import (
	"database/sql"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"
)

func (a *App) browseCategories(q *req) error {
	return a.read(q, func(tx *sql.Tx) error {
		return q.add(query(q, tx, "Categories", "SELECT * FROM categories"))
	})
}

func (a *App) browseRegions(q *req) error {
	return a.read(q, func(tx *sql.Tx) error {
		return q.add(query(q, tx, "Regions", "SELECT * FROM regions"))
	})
}

func (a *App) searchByCategory(q *req) error {
	category, err := q.intParam("category")
	if err != nil {
		return err
	}
	page, _ := strconv.Atoi(q.r.FormValue("page"))
	args := []any{category}
	filter := a.endDateFilter("end_date", 2, &args)
	args = append(args, 20*max(page, 0))
	return a.read(q, func(tx *sql.Tx) error {
		return q.add(query(q, tx, "Items", fmt.Sprintf("SELECT id, name, initial_price, max_bid, nb_of_bids, end_date FROM items WHERE category = $1 AND %s ORDER BY end_date LIMIT 20 OFFSET $%d", filter, len(args)), args...))
	})
}

func (a *App) searchByRegion(q *req) error {
	category, err := q.intParam("category")
	if err != nil {
		return err
	}
	region, err := q.intParam("region")
	if err != nil {
		return err
	}
	page, _ := strconv.Atoi(q.r.FormValue("page"))
	args := []any{category, region}
	filter := a.endDateFilter("items.end_date", 3, &args)
	args = append(args, 20*max(page, 0))
	return a.read(q, func(tx *sql.Tx) error {
		return q.add(query(q, tx, "Items", fmt.Sprintf(`SELECT items.id, items.name, items.initial_price, items.max_bid, items.nb_of_bids, items.end_date FROM items, users
WHERE items.category = $1 AND items.seller = users.id AND users.region = $2 AND %s ORDER BY items.end_date LIMIT 20 OFFSET $%d`, filter, len(args)), args...))
	})
}

// itemSections renders an item, its bids and its seller (ViewItem, PutBid).
func (a *App) itemSections(q *req, tx *sql.Tx, id int) error {
	item, err := itemOrOld(q, tx, "*", id)
	if err != nil {
		return err
	}
	if len(item.Rows) == 0 {
		return notFound(q, "item "+strconv.Itoa(id))
	}
	q.page.Sections = append(q.page.Sections, item)
	if err := q.add(query(q, tx, "Highest bid", "SELECT MAX(bid) FROM bids WHERE item_id = $1", id)); err != nil {
		return err
	}
	qty, _ := strconv.Atoi(column(item, "quantity")[0])
	if qty > 1 {
		if err := q.add(query(q, tx, "Top bids", "SELECT bid, qty FROM bids WHERE item_id = $1 ORDER BY bid DESC LIMIT $2", id, qty)); err != nil {
			return err
		}
	}
	if err := q.add(query(q, tx, "Bids", "SELECT COUNT(*) FROM bids WHERE item_id = $1", id)); err != nil {
		return err
	}
	seller, _ := strconv.Atoi(column(item, "seller")[0])
	return q.add(query(q, tx, "Seller", "SELECT nickname FROM users WHERE id = $1", seller))
}

// itemOrOld reads columns of an item, from old_items when it is no longer
// open (as RUBiS does).
func itemOrOld(q *req, tx *sql.Tx, columns string, id int) (section, error) {
	item, err := query(q, tx, "Item", "SELECT "+columns+" FROM items WHERE id = $1", id)
	if err != nil || len(item.Rows) > 0 {
		return item, err
	}
	return query(q, tx, "Item", "SELECT "+columns+" FROM old_items WHERE id = $1", id)
}

func (a *App) viewItem(q *req) error {
	id, err := q.intParam("itemId")
	if err != nil {
		return err
	}
	return a.readPage(q, a.itemFn, a.itemSections, id)
}

// nicknames adds a section with the nickname of each user id.
func nicknames(q *req, tx *sql.Tx, title string, ids []string) error {
	s := section{Title: title, Columns: []string{"nickname"}}
	for _, id := range ids {
		var nick string
		if err := tx.QueryRowContext(q.ctx, "SELECT nickname FROM users WHERE id = $1", id).Scan(&nick); err != nil && !errors.Is(err, sql.ErrNoRows) {
			return err
		}
		s.Rows = append(s.Rows, []string{nick})
	}
	q.page.Sections = append(q.page.Sections, s)
	return nil
}

func (a *App) viewUserInfo(q *req) error {
	id, err := q.intParam("userId")
	if err != nil {
		return err
	}
	return a.readPage(q, a.userFn, a.userSections, id)
}

// userSections are the user page's: the user, the comments about them and
// their authors.
func (a *App) userSections(q *req, tx *sql.Tx, id int) error {
	user, err := query(q, tx, "User", "SELECT * FROM users WHERE id = $1", id)
	if err != nil {
		return err
	}
	if len(user.Rows) == 0 {
		return notFound(q, "user "+strconv.Itoa(id))
	}
	q.page.Sections = append(q.page.Sections, user)
	comments, err := query(q, tx, "Comments", "SELECT * FROM comments WHERE to_user_id = $1", id)
	if err != nil {
		return err
	}
	q.page.Sections = append(q.page.Sections, comments)
	return nicknames(q, tx, "Comment authors", column(comments, "from_user_id"))
}

func (a *App) viewBidHistory(q *req) error {
	id, err := q.intParam("itemId")
	if err != nil {
		return err
	}
	return a.readPage(q, a.bidsFn, a.bidSections, id)
}

// bidSections are the bid history page's: the item's name, its bids and
// their bidders.
func (a *App) bidSections(q *req, tx *sql.Tx, id int) error {
	name, err := itemOrOld(q, tx, "name", id)
	if err != nil {
		return err
	}
	q.page.Sections = append(q.page.Sections, name)
	bids, err := query(q, tx, "Bids", "SELECT * FROM bids WHERE item_id = $1 ORDER BY date DESC", id)
	if err != nil {
		return err
	}
	q.page.Sections = append(q.page.Sections, bids)
	return nicknames(q, tx, "Bidders", column(bids, "user_id"))
}

func (a *App) buyNow(q *req) error {
	id, err := q.intParam("itemId")
	if err != nil {
		return err
	}
	return a.read(q, func(tx *sql.Tx) error {
		if _, err := a.auth(q, tx); err != nil {
			return err
		}
		item, err := query(q, tx, "Item", "SELECT * FROM items WHERE id = $1", id)
		if err != nil {
			return err
		}
		if len(item.Rows) == 0 {
			return notFound(q, "item "+strconv.Itoa(id))
		}
		q.page.Sections = append(q.page.Sections, item)
		seller, _ := strconv.Atoi(column(item, "seller")[0])
		return q.add(query(q, tx, "Seller", "SELECT nickname FROM users WHERE id = $1", seller))
	})
}

func (a *App) putBid(q *req) error {
	id, err := q.intParam("itemId")
	if err != nil {
		return err
	}
	return a.read(q, func(tx *sql.Tx) error {
		if _, err := a.auth(q, tx); err != nil {
			return err
		}
		return a.itemSections(q, tx, id)
	})
}

func (a *App) putComment(q *req) error {
	id, err := q.intParam("itemId")
	if err != nil {
		return err
	}
	to, err := q.intParam("to")
	if err != nil {
		return err
	}
	return a.read(q, func(tx *sql.Tx) error {
		if _, err := a.auth(q, tx); err != nil {
			return err
		}
		if err := q.add(query(q, tx, "Item", "SELECT * FROM items WHERE id = $1", id)); err != nil {
			return err
		}
		return q.add(query(q, tx, "To", "SELECT * FROM users WHERE id = $1", to))
	})
}

func (a *App) selectCategoryToSell(q *req) error {
	return a.read(q, func(tx *sql.Tx) error {
		if _, err := a.auth(q, tx); err != nil {
			return err
		}
		return q.add(query(q, tx, "Categories", "SELECT * FROM categories"))
	})
}

func (a *App) aboutMe(q *req) error {
	return a.read(q, func(tx *sql.Tx) error {
		id, err := a.auth(q, tx)
		if err != nil {
			return err
		}
		if err := q.add(query(q, tx, "User", "SELECT * FROM users WHERE id = $1", id)); err != nil {
			return err
		}
		args := []any{id}
		filter := a.endDateFilter("items.end_date", 2, &args)
		bids, err := query(q, tx, "Current bids", "SELECT item_id, MAX(bids.max_bid) FROM bids, items WHERE bids.user_id = $1 AND bids.item_id = items.id AND "+filter+" GROUP BY item_id ORDER BY item_id", args...)
		if err != nil {
			return err
		}
		q.page.Sections = append(q.page.Sections, bids)
		since := a.now().Add(-30 * 24 * time.Hour)
		won, err := query(q, tx, "Won items", "SELECT item_id, MAX(bids.max_bid) FROM bids, old_items WHERE bids.user_id = $1 AND bids.item_id = old_items.id AND old_items.end_date >= $2 GROUP BY item_id ORDER BY item_id", id, since)
		if err != nil {
			return err
		}
		q.page.Sections = append(q.page.Sections, won)
		if err := q.add(query(q, tx, "Bought", "SELECT * FROM buy_now WHERE buyer_id = $1 AND date >= $2", id, since)); err != nil {
			return err
		}
		args = []any{id}
		filter = a.endDateFilter("end_date", 2, &args)
		if err := q.add(query(q, tx, "Selling", "SELECT * FROM items WHERE seller = $1 AND "+filter, args...)); err != nil {
			return err
		}
		if err := q.add(query(q, tx, "Sold", "SELECT * FROM old_items WHERE seller = $1 AND end_date >= $2", id, since)); err != nil {
			return err
		}
		comments, err := query(q, tx, "Comments", "SELECT * FROM comments WHERE to_user_id = $1", id)
		if err != nil {
			return err
		}
		q.page.Sections = append(q.page.Sections, comments)
		return nicknames(q, tx, "Comment authors", column(comments, "from_user_id"))
	})
}

// Writes.

func (a *App) registerUser(q *req) error {
	nick := trim(q.r.FormValue("nickname"), 20)
	if nick == "" {
		q.status = http.StatusBadRequest
		return errors.New("a nickname is required")
	}
	return a.write(q, func(tx *sql.Tx) error {
		var region int
		if err := tx.QueryRowContext(q.ctx, "SELECT id FROM regions WHERE name = $1", q.r.FormValue("region")).Scan(&region); err != nil {
			if errors.Is(err, sql.ErrNoRows) {
				return notFound(q, "region")
			}
			return err
		}
		var exists int
		err := tx.QueryRowContext(q.ctx, "SELECT id FROM users WHERE nickname = $1", nick).Scan(&exists)
		if err == nil {
			q.status = http.StatusConflict
			return fmt.Errorf("nickname %s is taken", nick)
		} else if !errors.Is(err, sql.ErrNoRows) {
			return err
		}
		if _, err := tx.ExecContext(q.ctx, `INSERT INTO users (firstname, lastname, nickname, password, email, rating, balance, creation_date, region)
VALUES ($1, $2, $3, $4, $5, 0, 0, $6, $7)`, trim(q.r.FormValue("firstname"), 20), trim(q.r.FormValue("lastname"), 20), nick,
			trim(q.r.FormValue("password"), 20), trim(q.r.FormValue("email"), 50), a.cfg.Clock().UTC(), region); err != nil {
			return err
		}
		return q.add(query(q, tx, "User", "SELECT * FROM users WHERE nickname = $1", nick))
	})
}

func (a *App) storeBuyNow(q *req) error {
	id, err := q.intParam("itemId")
	if err != nil {
		return err
	}
	buyer, err := q.intParam("userId")
	if err != nil {
		return err
	}
	qty, err := q.intParam("qty")
	if err != nil {
		return err
	}
	return a.write(q, func(tx *sql.Tx) error {
		var left int
		if err := tx.QueryRowContext(q.ctx, "SELECT quantity FROM items WHERE id = $1 FOR UPDATE", id).Scan(&left); err != nil {
			if errors.Is(err, sql.ErrNoRows) {
				return notFound(q, "item")
			}
			return err
		}
		if qty < 1 || qty > left {
			q.status = http.StatusConflict
			return fmt.Errorf("%d left, %d asked", left, qty)
		}
		if qty == left {
			_, err = tx.ExecContext(q.ctx, "UPDATE items SET quantity = $1, end_date = now() WHERE id = $2", 0, id)
		} else {
			_, err = tx.ExecContext(q.ctx, "UPDATE items SET quantity = $1 WHERE id = $2", left-qty, id)
		}
		if err != nil {
			return err
		}
		_, err = tx.ExecContext(q.ctx, "INSERT INTO buy_now (buyer_id, item_id, qty, date) VALUES ($1, $2, $3, now())", buyer, id, qty)
		q.page.Message = "Bought"
		return err
	})
}

func (a *App) storeBid(q *req) error {
	id, err := q.intParam("itemId")
	if err != nil {
		return err
	}
	user, err := q.intParam("userId")
	if err != nil {
		return err
	}
	bid, err := q.floatParam("bid")
	if err != nil {
		return err
	}
	maxBid, err := q.floatParam("maxBid")
	if err != nil {
		return err
	}
	qty, err := q.intParam("qty")
	if err != nil {
		return err
	}
	return a.write(q, func(tx *sql.Tx) error {
		var current float64
		if err := tx.QueryRowContext(q.ctx, "SELECT max_bid FROM items WHERE id = $1 FOR UPDATE", id).Scan(&current); err != nil {
			if errors.Is(err, sql.ErrNoRows) {
				return notFound(q, "item")
			}
			return err
		}
		if maxBid > current {
			if _, err := tx.ExecContext(q.ctx, "UPDATE items SET max_bid = $1 WHERE id = $2", maxBid, id); err != nil {
				return err
			}
		}
		if _, err := tx.ExecContext(q.ctx, "INSERT INTO bids (user_id, item_id, qty, bid, max_bid, date) VALUES ($1, $2, $3, $4, $5, now())", user, id, qty, bid, maxBid); err != nil {
			return err
		}
		_, err := tx.ExecContext(q.ctx, "UPDATE items SET nb_of_bids = nb_of_bids + 1 WHERE id = $1", id)
		q.page.Message = "Bid stored"
		return err
	})
}

func (a *App) storeComment(q *req) error {
	id, err := q.intParam("itemId")
	if err != nil {
		return err
	}
	from, err := q.intParam("from")
	if err != nil {
		return err
	}
	to, err := q.intParam("to")
	if err != nil {
		return err
	}
	rating, err := q.intParam("rating")
	if err != nil {
		return err
	}
	return a.write(q, func(tx *sql.Tx) error {
		var r int
		if err := tx.QueryRowContext(q.ctx, "SELECT rating FROM users WHERE id = $1 FOR UPDATE", to).Scan(&r); err != nil {
			if errors.Is(err, sql.ErrNoRows) {
				return notFound(q, "user")
			}
			return err
		}
		if _, err := tx.ExecContext(q.ctx, "UPDATE users SET rating = rating + $1 WHERE id = $2", rating, to); err != nil {
			return err
		}
		_, err := tx.ExecContext(q.ctx, "INSERT INTO comments (from_user_id, to_user_id, item_id, rating, date, comment) VALUES ($1, $2, $3, $4, now(), $5)",
			from, to, id, rating, trim(q.r.FormValue("comment"), 2048))
		q.page.Message = "Comment stored"
		return err
	})
}

func (a *App) registerItem(q *req) error {
	user, err := q.intParam("userId")
	if err != nil {
		return err
	}
	category, err := q.intParam("categoryId")
	if err != nil {
		return err
	}
	initial, err := q.floatParam("initialPrice")
	if err != nil {
		return err
	}
	qty, err := q.intParam("quantity")
	if err != nil {
		return err
	}
	days, err := q.intParam("duration")
	if err != nil {
		return err
	}
	reserve, _ := strconv.ParseFloat(q.r.FormValue("reservePrice"), 64)
	buyNow, _ := strconv.ParseFloat(q.r.FormValue("buyNow"), 64)
	return a.write(q, func(tx *sql.Tx) error {
		start := a.cfg.Clock().UTC()
		_, err := tx.ExecContext(q.ctx, `INSERT INTO items (name, description, initial_price, quantity, reserve_price, buy_now, nb_of_bids, max_bid, start_date, end_date, seller, category)
VALUES ($1, $2, $3, $4, $5, $6, 0, 0, $7, $8, $9, $10)`, trim(q.r.FormValue("name"), 100), q.r.FormValue("description"), initial, qty, reserve, buyNow,
			start, start.Add(time.Duration(days)*24*time.Hour), user, category)
		q.page.Message = "Item registered"
		return err
	})
}
