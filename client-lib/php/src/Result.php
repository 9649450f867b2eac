<?php

declare(strict_types=1);

namespace Larder;

/**
 * The complete result of one statement, read from the server at once.
 * Values are PostgreSQL's text forms (strings), NULL is null; the column
 * types are the OIDs PostgreSQL described them with, for callers that
 * convert.
 *
 * @implements \IteratorAggregate<int, array<string, ?string>>
 */
final class Result implements \IteratorAggregate, \Countable
{
    /** @var list<string> */
    private array $names;

    /** @var list<int> */
    private array $types;

    /** @var list<list<?string>> */
    private array $rows;

    private int $affected;

    private string $tag;

    /**
     * @param list<string> $names
     * @param list<int> $types
     * @param list<list<?string>> $rows
     */
    public function __construct(array $names, array $types, array $rows, int $affected = 0, string $tag = '')
    {
        $this->names = $names;
        $this->types = $types;
        $this->rows = $rows;
        $this->affected = $affected;
        $this->tag = $tag;
    }

    /** Reads a whole libpq result. */
    public static function fromPg(\PgSql\Result $r): self
    {
        $names = [];
        $types = [];
        $n = pg_num_fields($r);
        for ($i = 0; $i < $n; $i++) {
            $names[] = pg_field_name($r, $i);
            // The OID needs no catalog query (pg_field_type would run one).
            $types[] = (int) pg_field_type_oid($r, $i);
        }
        $rows = $n > 0 ? pg_fetch_all($r, PGSQL_NUM) : [];
        return new self($names, $types, array_values($rows), pg_affected_rows($r), (string) pg_result_status($r, PGSQL_STATUS_STRING));
    }

    /** @return list<string> the column names, in order */
    public function fields(): array
    {
        return $this->names;
    }

    /** @return list<int> the columns' type OIDs, in order */
    public function types(): array
    {
        return $this->types;
    }

    /** @return list<list<?string>> the rows, each a list of values in column order */
    public function rows(): array
    {
        return $this->rows;
    }

    /**
     * The rows as maps from column name to value (a later column of the same
     * name wins; rows() keeps them all).
     *
     * @return list<array<string, ?string>>
     */
    public function assoc(): array
    {
        $out = [];
        foreach ($this->rows as $row) {
            $out[] = $this->combine($row);
        }
        return $out;
    }

    /** @return array<string, ?string>|null the first row by column name, or null */
    public function first(): ?array
    {
        return $this->rows === [] ? null : $this->combine($this->rows[0]);
    }

    /** The first column of the first row, or null (no row, or NULL). */
    public function value(): ?string
    {
        return $this->rows[0][0] ?? null;
    }

    /**
     * The values of one column, by name or position.
     *
     * @return list<?string>
     */
    public function column(string|int $column): array
    {
        $i = is_int($column) ? $column : array_search($column, $this->names, true);
        if ($i === false || $i < 0 || $i >= count($this->names)) {
            throw new \OutOfRangeException('no column ' . $column);
        }
        return array_map(static fn (array $row): ?string => $row[$i], $this->rows);
    }

    /** Rows a write changed (INSERT, UPDATE, DELETE, …) or a query returned. */
    public function affectedRows(): int
    {
        return $this->affected;
    }

    /** The command tag: "SELECT 3", "INSERT 0 1", … */
    public function commandTag(): string
    {
        return $this->tag;
    }

    public function count(): int
    {
        return count($this->rows);
    }

    /** @return \Generator<int, array<string, ?string>> */
    public function getIterator(): \Generator
    {
        foreach ($this->rows as $i => $row) {
            yield $i => $this->combine($row);
        }
    }

    /**
     * @param list<?string> $row
     * @return array<string, ?string>
     */
    private function combine(array $row): array
    {
        $out = [];
        foreach ($this->names as $i => $name) {
            $out[$name] = $row[$i];
        }
        return $out;
    }
}
