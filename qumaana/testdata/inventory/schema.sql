-- Ferdinand's inventory example (Garrod et al., VLDB 2008, section 3).
CREATE TABLE inv (
    id         int PRIMARY KEY,
    name       text NOT NULL,
    qty        int NOT NULL,
    entry_date date NOT NULL
);
ALTER TABLE inv REPLICA IDENTITY FULL;
