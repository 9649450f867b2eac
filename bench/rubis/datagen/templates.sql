-- RUBiS, PostgreSQL dialect: every statement of ../../../../shared/rubis/README.md.
-- Reads that compare with the current time take it as a parameter ($now, rounded).

-- Authentication (every authenticated page)
SELECT id FROM users WHERE nickname = $1 AND password = $2;
-- RegisterUser
SELECT * FROM regions WHERE name = $1;
SELECT * FROM users WHERE nickname = $1;
INSERT INTO users (firstname, lastname, nickname, password, email, rating, balance, creation_date, region) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9);
-- BrowseCategories, SelectCategoryToSellItem, BrowseCategoriesInRegion
SELECT * FROM categories;
-- BrowseRegions
SELECT * FROM regions;
-- SearchItemsByCategory
SELECT id, name, initial_price, max_bid, nb_of_bids, end_date FROM items WHERE category = $1 AND end_date >= $2 ORDER BY end_date LIMIT 20 OFFSET $3;
-- SearchItemsByRegion
SELECT items.id, items.name, items.initial_price, items.max_bid, items.nb_of_bids, items.end_date FROM items, users WHERE items.category = $1 AND items.seller = users.id AND users.region = $2 AND items.end_date >= $3 ORDER BY items.end_date LIMIT 20 OFFSET $4;
-- ViewItem, BuyNow, PutBid, PutComment
SELECT * FROM items WHERE id = $1;
SELECT * FROM old_items WHERE id = $1;
SELECT MAX(bid) FROM bids WHERE item_id = $1;
SELECT bid, qty FROM bids WHERE item_id = $1 ORDER BY bid DESC LIMIT $2;
SELECT COUNT(*) FROM bids WHERE item_id = $1;
SELECT nickname FROM users WHERE id = $1;
-- ViewUserInfo, PutComment
SELECT * FROM users WHERE id = $1;
SELECT * FROM comments WHERE to_user_id = $1;
-- ViewBidHistory
SELECT name FROM items WHERE id = $1;
SELECT name FROM old_items WHERE id = $1;
SELECT * FROM bids WHERE item_id = $1 ORDER BY date DESC;
-- StoreBuyNow (one transaction)
SELECT * FROM items WHERE id = $1 FOR UPDATE;
UPDATE items SET quantity = $1 WHERE id = $2;
UPDATE items SET quantity = $1, end_date = now() WHERE id = $2;
INSERT INTO buy_now (buyer_id, item_id, qty, date) VALUES ($1, $2, $3, now());
-- StoreBid (one transaction)
SELECT max_bid FROM items WHERE id = $1 FOR UPDATE;
UPDATE items SET max_bid = $1 WHERE id = $2;
INSERT INTO bids (user_id, item_id, qty, bid, max_bid, date) VALUES ($1, $2, $3, $4, $5, now());
UPDATE items SET nb_of_bids = nb_of_bids + 1 WHERE id = $1;
-- StoreComment (one transaction)
SELECT rating FROM users WHERE id = $1 FOR UPDATE;
UPDATE users SET rating = rating + $1 WHERE id = $2;
INSERT INTO comments (from_user_id, to_user_id, item_id, rating, date, comment) VALUES ($1, $2, $3, $4, now(), $5);
-- RegisterItem
INSERT INTO items (name, description, initial_price, quantity, reserve_price, buy_now, nb_of_bids, max_bid, start_date, end_date, seller, category) VALUES ($1, $2, $3, $4, $5, $6, 0, 0, $7, $8, $9, $10);
-- AboutMe
SELECT item_id, MAX(bids.max_bid) FROM bids, items WHERE bids.user_id = $1 AND bids.item_id = items.id AND items.end_date >= $2 GROUP BY item_id;
SELECT item_id, MAX(bids.max_bid) FROM bids, old_items WHERE bids.user_id = $1 AND bids.item_id = old_items.id AND old_items.end_date >= $2 - interval '30 days' GROUP BY item_id;
SELECT * FROM buy_now WHERE buyer_id = $1 AND date >= $2 - interval '30 days';
SELECT * FROM items WHERE seller = $1 AND end_date >= $2;
SELECT * FROM old_items WHERE seller = $1 AND end_date >= $2 - interval '30 days';
-- The original now() forms, uncacheable as written
SELECT id, name, initial_price, max_bid, nb_of_bids, end_date FROM items WHERE category = $1 AND end_date >= NOW() ORDER BY end_date LIMIT 20 OFFSET $2;
SELECT * FROM items WHERE seller = $1 AND end_date >= NOW();
