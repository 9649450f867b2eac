package wan

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	larder "github.com/larderdb/larder/client-lib"
)

// ListingSize is how many items a Listing page shows.
const ListingSize = 50

// listingSQL is the data-heavy page's query: a category's open items
// ending first, with their descriptions (RUBiS's largest column: up to
// 8 KiB of text each), in the style of a bulletin board's front page.
// $2 is the time rounded down to a minute, as the RUBiS application
// passes it, so that the page is cacheable.
const listingSQL = `SELECT id, name, description, initial_price, max_bid, nb_of_bids, end_date FROM items
WHERE category = $1 AND end_date >= $2 ORDER BY end_date, id LIMIT ` + "50"

// listing serves GET /Listing?category=N on db in a read-only transaction
// with the staleness limit.
func listing(db *sql.DB, staleness time.Duration) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		cat, err := strconv.Atoi(r.FormValue("category"))
		if err != nil {
			http.Error(w, "category", http.StatusBadRequest)
			return
		}
		now := time.Now().Truncate(time.Minute)
		var page []byte
		for attempt := 1; ; attempt++ {
			page, err = listingPage(larder.WithStaleness(r.Context(), staleness), db, cat, now)
			if attempt == 3 || !errors.Is(err, larder.ErrRetry) {
				break
			}
		}
		if err != nil {
			http.Error(w, err.Error(), http.StatusInternalServerError)
			return
		}
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = w.Write(page)
	}
}

func listingPage(ctx context.Context, db *sql.DB, cat int, now time.Time) ([]byte, error) {
	tx, err := db.BeginTx(ctx, &sql.TxOptions{ReadOnly: true})
	if err != nil {
		return nil, err
	}
	defer func() { _ = tx.Rollback() }()
	rows, err := tx.QueryContext(ctx, listingSQL, cat, now)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var page []byte
	for rows.Next() {
		var id, bids int
		var name, desc string
		var price, maxBid float64
		var end time.Time
		if err := rows.Scan(&id, &name, &desc, &price, &maxBid, &bids, &end); err != nil {
			return nil, err
		}
		page = fmt.Appendf(page, "%d\t%s\t%.2f\t%.2f\t%d\t%s\n%s\n\n", id, name, price, maxBid, bids, end.Format(time.RFC3339), desc)
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	return page, tx.Commit()
}
