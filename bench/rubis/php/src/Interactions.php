<?php

declare(strict_types=1);

namespace Rubis;

use Larder\Client;

/**
 * The interactions that touch the database, one method each, named after
 * the page (lowercase first letter), ported from bench/rubis/app's
 * interactions.go with the same SQL and the same sections.
 */
trait Interactions
{
    private function browseCategories(Request $q): void
    {
        $this->read($q, static function (Client $db) use ($q): void {
            $q->sections[] = self::query($db, 'Categories', 'SELECT * FROM categories');
        });
    }

    // BrowseCategoriesInRegion shows the categories, as the Go application does.
    private function browseCategoriesInRegion(Request $q): void
    {
        $this->browseCategories($q);
    }

    private function browseRegions(Request $q): void
    {
        $this->read($q, static function (Client $db) use ($q): void {
            $q->sections[] = self::query($db, 'Regions', 'SELECT * FROM regions');
        });
    }

    private function searchItemsInCategory(Request $q): void
    {
        $category = $q->intParam('category');
        $page = Request::atoi($q->form('page')) ?? 0;
        $args = [$category];
        $filter = $this->endDateFilter('end_date', 2, $args);
        $args[] = 20 * max($page, 0);
        $sql = sprintf('SELECT id, name, initial_price, max_bid, nb_of_bids, end_date FROM items WHERE category = $1 AND %s ORDER BY end_date LIMIT 20 OFFSET $%d', $filter, count($args));
        $this->read($q, static function (Client $db) use ($q, $sql, $args): void {
            $q->sections[] = self::query($db, 'Items', $sql, $args);
        });
    }

    private function searchItemsInRegion(Request $q): void
    {
        $category = $q->intParam('category');
        $region = $q->intParam('region');
        $page = Request::atoi($q->form('page')) ?? 0;
        $args = [$category, $region];
        $filter = $this->endDateFilter('items.end_date', 3, $args);
        $args[] = 20 * max($page, 0);
        $sql = sprintf("SELECT items.id, items.name, items.initial_price, items.max_bid, items.nb_of_bids, items.end_date FROM items, users\nWHERE items.category = $1 AND items.seller = users.id AND users.region = $2 AND %s ORDER BY items.end_date LIMIT 20 OFFSET $%d", $filter, count($args));
        $this->read($q, static function (Client $db) use ($q, $sql, $args): void {
            $q->sections[] = self::query($db, 'Items', $sql, $args);
        });
    }

    /** An item, its bids and its seller (ViewItem, PutBid). */
    private static function itemSections(Request $q, Client $db, int $id): void
    {
        $item = self::itemOrOld($db, '*', $id);
        if ($item['rows'] === []) {
            throw self::notFound('item ' . $id);
        }
        $q->sections[] = $item;
        $q->sections[] = self::query($db, 'Highest bid', 'SELECT MAX(bid) FROM bids WHERE item_id = $1', [$id]);
        $qty = Request::atoi(self::column($item, 'quantity')[0] ?? '') ?? 0;
        if ($qty > 1) {
            $q->sections[] = self::query($db, 'Top bids', 'SELECT bid, qty FROM bids WHERE item_id = $1 ORDER BY bid DESC LIMIT $2', [$id, $qty]);
        }
        $q->sections[] = self::query($db, 'Bids', 'SELECT COUNT(*) FROM bids WHERE item_id = $1', [$id]);
        $seller = Request::atoi(self::column($item, 'seller')[0] ?? '') ?? 0;
        $q->sections[] = self::query($db, 'Seller', 'SELECT nickname FROM users WHERE id = $1', [$seller]);
    }

    /**
     * Columns of an item, from old_items when it is no longer open.
     *
     * @return array{title: string, columns: list<string>, rows: list<list<string>>}
     */
    private static function itemOrOld(Client $db, string $columns, int $id): array
    {
        $item = self::query($db, 'Item', 'SELECT ' . $columns . ' FROM items WHERE id = $1', [$id]);
        if ($item['rows'] !== []) {
            return $item;
        }
        return self::query($db, 'Item', 'SELECT ' . $columns . ' FROM old_items WHERE id = $1', [$id]);
    }

    private function viewItem(Request $q): void
    {
        $id = $q->intParam('itemId');
        $this->read($q, static function (Client $db) use ($q, $id): void {
            self::itemSections($q, $db, $id);
        });
    }

    /**
     * A section with the nickname of each user id ("" for one not found).
     *
     * @param list<string> $ids
     */
    private static function nicknames(Request $q, Client $db, string $title, array $ids): void
    {
        $rows = [];
        foreach ($ids as $id) {
            $rows[] = [(string) $db->queryValue('SELECT nickname FROM users WHERE id = $1', [$id])];
        }
        $q->sections[] = ['title' => $title, 'columns' => ['nickname'], 'rows' => $rows];
    }

    private function viewUserInfo(Request $q): void
    {
        $id = $q->intParam('userId');
        $this->read($q, static function (Client $db) use ($q, $id): void {
            $user = self::query($db, 'User', 'SELECT * FROM users WHERE id = $1', [$id]);
            if ($user['rows'] === []) {
                throw self::notFound('user ' . $id);
            }
            $q->sections[] = $user;
            $comments = self::query($db, 'Comments', 'SELECT * FROM comments WHERE to_user_id = $1', [$id]);
            $q->sections[] = $comments;
            self::nicknames($q, $db, 'Comment authors', self::column($comments, 'from_user_id'));
        });
    }

    private function viewBidHistory(Request $q): void
    {
        $id = $q->intParam('itemId');
        $this->read($q, static function (Client $db) use ($q, $id): void {
            $q->sections[] = self::itemOrOld($db, 'name', $id);
            $bids = self::query($db, 'Bids', 'SELECT * FROM bids WHERE item_id = $1 ORDER BY date DESC', [$id]);
            $q->sections[] = $bids;
            self::nicknames($q, $db, 'Bidders', self::column($bids, 'user_id'));
        });
    }

    private function buyNow(Request $q): void
    {
        $id = $q->intParam('itemId');
        $this->read($q, static function (Client $db) use ($q, $id): void {
            self::auth($q, $db);
            $item = self::query($db, 'Item', 'SELECT * FROM items WHERE id = $1', [$id]);
            if ($item['rows'] === []) {
                throw self::notFound('item ' . $id);
            }
            $q->sections[] = $item;
            $seller = Request::atoi(self::column($item, 'seller')[0] ?? '') ?? 0;
            $q->sections[] = self::query($db, 'Seller', 'SELECT nickname FROM users WHERE id = $1', [$seller]);
        });
    }

    private function putBid(Request $q): void
    {
        $id = $q->intParam('itemId');
        $this->read($q, static function (Client $db) use ($q, $id): void {
            self::auth($q, $db);
            self::itemSections($q, $db, $id);
        });
    }

    private function putComment(Request $q): void
    {
        $id = $q->intParam('itemId');
        $to = $q->intParam('to');
        $this->read($q, static function (Client $db) use ($q, $id, $to): void {
            self::auth($q, $db);
            $q->sections[] = self::query($db, 'Item', 'SELECT * FROM items WHERE id = $1', [$id]);
            $q->sections[] = self::query($db, 'To', 'SELECT * FROM users WHERE id = $1', [$to]);
        });
    }

    private function selectCategoryToSellItem(Request $q): void
    {
        $this->read($q, static function (Client $db) use ($q): void {
            self::auth($q, $db);
            $q->sections[] = self::query($db, 'Categories', 'SELECT * FROM categories');
        });
    }

    private function aboutMe(Request $q): void
    {
        $now = $this->now();
        $since = gmdate('Y-m-d H:i:s', $now - 30 * 86400);
        $this->read($q, function (Client $db) use ($q, $since): void {
            $id = self::auth($q, $db);
            $q->sections[] = self::query($db, 'User', 'SELECT * FROM users WHERE id = $1', [$id]);
            $args = [$id];
            $filter = $this->endDateFilter('items.end_date', 2, $args);
            $q->sections[] = self::query($db, 'Current bids', 'SELECT item_id, MAX(bids.max_bid) FROM bids, items WHERE bids.user_id = $1 AND bids.item_id = items.id AND ' . $filter . ' GROUP BY item_id ORDER BY item_id', $args);
            $q->sections[] = self::query($db, 'Won items', 'SELECT item_id, MAX(bids.max_bid) FROM bids, old_items WHERE bids.user_id = $1 AND bids.item_id = old_items.id AND old_items.end_date >= $2 GROUP BY item_id ORDER BY item_id', [$id, $since]);
            $q->sections[] = self::query($db, 'Bought', 'SELECT * FROM buy_now WHERE buyer_id = $1 AND date >= $2', [$id, $since]);
            $args = [$id];
            $filter = $this->endDateFilter('end_date', 2, $args);
            $q->sections[] = self::query($db, 'Selling', 'SELECT * FROM items WHERE seller = $1 AND ' . $filter, $args);
            $q->sections[] = self::query($db, 'Sold', 'SELECT * FROM old_items WHERE seller = $1 AND end_date >= $2', [$id, $since]);
            $comments = self::query($db, 'Comments', 'SELECT * FROM comments WHERE to_user_id = $1', [$id]);
            $q->sections[] = $comments;
            self::nicknames($q, $db, 'Comment authors', self::column($comments, 'from_user_id'));
        });
    }

    // Writes.

    private function registerUser(Request $q): void
    {
        $nick = self::trim($q->form('nickname'), 20);
        if ($nick === '') {
            throw new HttpError(400, 'a nickname is required');
        }
        $created = self::timestamp($this->time());
        $this->write(static function (Client $db) use ($q, $nick, $created): void {
            $region = $db->queryValue('SELECT id FROM regions WHERE name = $1', [$q->form('region')]);
            if ($region === null) {
                throw self::notFound('region');
            }
            if ($db->queryRow('SELECT id FROM users WHERE nickname = $1', [$nick]) !== null) {
                throw new HttpError(409, "nickname $nick is taken");
            }
            $db->execute("INSERT INTO users (firstname, lastname, nickname, password, email, rating, balance, creation_date, region)\nVALUES ($1, $2, $3, $4, $5, 0, 0, $6, $7)",
                [self::trim($q->form('firstname'), 20), self::trim($q->form('lastname'), 20), $nick,
                    self::trim($q->form('password'), 20), self::trim($q->form('email'), 50), $created, (int) $region]);
            $q->sections[] = self::query($db, 'User', 'SELECT * FROM users WHERE nickname = $1', [$nick]);
        });
    }

    private function storeBuyNow(Request $q): void
    {
        $id = $q->intParam('itemId');
        $buyer = $q->intParam('userId');
        $qty = $q->intParam('qty');
        $this->write(static function (Client $db) use ($q, $id, $buyer, $qty): void {
            $row = $db->queryRow('SELECT quantity FROM items WHERE id = $1 FOR UPDATE', [$id]);
            if ($row === null) {
                throw self::notFound('item');
            }
            $left = (int) $row['quantity'];
            if ($qty < 1 || $qty > $left) {
                throw new HttpError(409, sprintf('%d left, %d asked', $left, $qty));
            }
            if ($qty === $left) {
                $db->execute('UPDATE items SET quantity = $1, end_date = now() WHERE id = $2', [0, $id]);
            } else {
                $db->execute('UPDATE items SET quantity = $1 WHERE id = $2', [$left - $qty, $id]);
            }
            $db->execute('INSERT INTO buy_now (buyer_id, item_id, qty, date) VALUES ($1, $2, $3, now())', [$buyer, $id, $qty]);
            $q->message = 'Bought';
        });
    }

    private function storeBid(Request $q): void
    {
        $id = $q->intParam('itemId');
        $user = $q->intParam('userId');
        $bid = $q->floatParam('bid');
        $maxBid = $q->floatParam('maxBid');
        $qty = $q->intParam('qty');
        $this->write(static function (Client $db) use ($q, $id, $user, $bid, $maxBid, $qty): void {
            $row = $db->queryRow('SELECT max_bid FROM items WHERE id = $1 FOR UPDATE', [$id]);
            if ($row === null) {
                throw self::notFound('item');
            }
            if ($row['max_bid'] === null) {
                throw new \RuntimeException('the item has no max_bid');
            }
            // A real, read as the Go application reads it (a float32).
            $current = Render::float32(Render::float($row['max_bid']));
            if ($maxBid > $current) {
                $db->execute('UPDATE items SET max_bid = $1 WHERE id = $2', [$maxBid, $id]);
            }
            $db->execute('INSERT INTO bids (user_id, item_id, qty, bid, max_bid, date) VALUES ($1, $2, $3, $4, $5, now())', [$user, $id, $qty, $bid, $maxBid]);
            $db->execute('UPDATE items SET nb_of_bids = nb_of_bids + 1 WHERE id = $1', [$id]);
            $q->message = 'Bid stored';
        });
    }

    private function storeComment(Request $q): void
    {
        $id = $q->intParam('itemId');
        $from = $q->intParam('from');
        $to = $q->intParam('to');
        $rating = $q->intParam('rating');
        $this->write(static function (Client $db) use ($q, $id, $from, $to, $rating): void {
            $row = $db->queryRow('SELECT rating FROM users WHERE id = $1 FOR UPDATE', [$to]);
            if ($row === null) {
                throw self::notFound('user');
            }
            if ($row['rating'] === null) {
                throw new \RuntimeException('the user has no rating');
            }
            $db->execute('UPDATE users SET rating = rating + $1 WHERE id = $2', [$rating, $to]);
            $db->execute('INSERT INTO comments (from_user_id, to_user_id, item_id, rating, date, comment) VALUES ($1, $2, $3, $4, now(), $5)',
                [$from, $to, $id, $rating, self::trim($q->form('comment'), 2048)]);
            $q->message = 'Comment stored';
        });
    }

    private function registerItem(Request $q): void
    {
        $user = $q->intParam('userId');
        $category = $q->intParam('categoryId');
        $initial = $q->floatParam('initialPrice');
        $qty = $q->intParam('quantity');
        $days = $q->intParam('duration');
        $reserve = Request::parseFloat($q->form('reservePrice')) ?? 0.0;
        $buyNow = Request::parseFloat($q->form('buyNow')) ?? 0.0;
        $start = $this->time();
        $this->write(static function (Client $db) use ($q, $user, $category, $initial, $qty, $days, $reserve, $buyNow, $start): void {
            $db->execute("INSERT INTO items (name, description, initial_price, quantity, reserve_price, buy_now, nb_of_bids, max_bid, start_date, end_date, seller, category)\nVALUES ($1, $2, $3, $4, $5, $6, 0, 0, $7, $8, $9, $10)",
                [self::trim($q->form('name'), 100), $q->form('description'), $initial, $qty, $reserve, $buyNow,
                    self::timestamp($start), self::timestamp($start + $days * 86400), $user, $category]);
            $q->message = 'Item registered';
        });
    }
}
