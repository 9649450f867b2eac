-- The table the library's tests use (go test creates it before the front's
-- stack starts, so that its queries are analyzed and cached).
CREATE TABLE accounts (id int PRIMARY KEY, owner text NOT NULL, balance bigint NOT NULL);
ALTER TABLE accounts REPLICA IDENTITY FULL;
