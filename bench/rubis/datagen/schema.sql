-- RUBiS, PostgreSQL dialect (../../../../shared/rubis/README.md). Money is real, as in the original.
-- Every table has REPLICA IDENTITY FULL: the invalidator then knows the old value of every tag column
-- and which columns an UPDATE changed. Secondary indexes are created after the load.
DROP TABLE IF EXISTS categories, regions, users, items, old_items, bids, comments, buy_now;
CREATE TABLE categories (id serial PRIMARY KEY, name varchar(50));
CREATE TABLE regions (id serial PRIMARY KEY, name varchar(25));
CREATE TABLE users (id serial PRIMARY KEY, firstname varchar(20), lastname varchar(20),
  nickname varchar(20) NOT NULL UNIQUE, password varchar(20) NOT NULL, email varchar(50) NOT NULL,
  rating int, balance real, creation_date timestamp, region int NOT NULL);
CREATE TABLE items (id serial PRIMARY KEY, name varchar(100), description text, initial_price real NOT NULL,
  quantity int NOT NULL, reserve_price real DEFAULT 0, buy_now real DEFAULT 0, nb_of_bids int DEFAULT 0,
  max_bid real DEFAULT 0, start_date timestamp, end_date timestamp, seller int NOT NULL, category int NOT NULL);
CREATE TABLE old_items (id int PRIMARY KEY, name varchar(100), description text, initial_price real NOT NULL,
  quantity int NOT NULL, reserve_price real DEFAULT 0, buy_now real DEFAULT 0, nb_of_bids int DEFAULT 0,
  max_bid real DEFAULT 0, start_date timestamp, end_date timestamp, seller int NOT NULL, category int NOT NULL);
CREATE TABLE bids (id serial PRIMARY KEY, user_id int NOT NULL, item_id int NOT NULL, qty int NOT NULL,
  bid real NOT NULL, max_bid real NOT NULL, date timestamp);
CREATE TABLE comments (id serial PRIMARY KEY, from_user_id int, to_user_id int, item_id int, rating int,
  date timestamp, comment text);
CREATE TABLE buy_now (id serial PRIMARY KEY, buyer_id int, item_id int, qty int, date timestamp);
ALTER TABLE categories REPLICA IDENTITY FULL;
ALTER TABLE regions REPLICA IDENTITY FULL;
ALTER TABLE users REPLICA IDENTITY FULL;
ALTER TABLE items REPLICA IDENTITY FULL;
ALTER TABLE old_items REPLICA IDENTITY FULL;
ALTER TABLE bids REPLICA IDENTITY FULL;
ALTER TABLE comments REPLICA IDENTITY FULL;
ALTER TABLE buy_now REPLICA IDENTITY FULL;
