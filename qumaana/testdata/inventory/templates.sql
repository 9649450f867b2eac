-- U1: a new item
INSERT INTO inv (id, name, qty, entry_date) VALUES (?, ?, ?, ?);
-- U2: restock by id
UPDATE inv SET qty = ? WHERE id = ?;
-- Q3: stock of an item by name
SELECT qty FROM inv WHERE name = ?;
-- Q4: items entered after a date
SELECT name FROM inv WHERE entry_date > ?;
-- Q5: items running low
SELECT * FROM inv WHERE qty < ?;
