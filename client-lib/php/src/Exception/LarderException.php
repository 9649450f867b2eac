<?php

declare(strict_types=1);

namespace Larder\Exception;

/**
 * The base of every error the library throws: catch it to handle them all.
 * It carries PostgreSQL's SQLSTATE when the server gave one.
 */
class LarderException extends \RuntimeException
{
    /** @var string|null the five-character SQLSTATE, or null */
    private ?string $sqlState;

    public function __construct(string $message, ?string $sqlState = null, ?\Throwable $previous = null)
    {
        parent::__construct($message, 0, $previous);
        $this->sqlState = $sqlState;
    }

    /** The SQLSTATE of the error ("40001", "23505", …), or null when there is none. */
    public function getSqlState(): ?string
    {
        return $this->sqlState;
    }
}
