<?php

declare(strict_types=1);

namespace Larder\Exception;

/**
 * A statement failed on the server: PostgreSQL's (or the front's) error,
 * with its SQLSTATE and the fields libpq reports.
 */
class QueryException extends LarderException
{
    private string $sql;

    /** @var array<string, string> PostgreSQL's error fields: detail, hint, constraint, … */
    private array $fields;

    /**
     * @param array<string, string> $fields
     */
    public function __construct(string $message, ?string $sqlState, string $sql, array $fields = [], ?\Throwable $previous = null)
    {
        parent::__construct($message, $sqlState, $previous);
        $this->sql = $sql;
        $this->fields = $fields;
    }

    /** The statement that failed. */
    public function getSql(): string
    {
        return $this->sql;
    }

    /** The server's DETAIL, or null. */
    public function getDetail(): ?string
    {
        return $this->fields['detail'] ?? null;
    }

    /** The server's HINT, or null. */
    public function getHint(): ?string
    {
        return $this->fields['hint'] ?? null;
    }

    /** The constraint a violation names, or null. */
    public function getConstraint(): ?string
    {
        return $this->fields['constraint'] ?? null;
    }

    /**
     * Every field the server sent (severity, detail, hint, schema, table,
     * column, datatype, constraint), by name.
     *
     * @return array<string, string>
     */
    public function getFields(): array
    {
        return $this->fields;
    }
}
