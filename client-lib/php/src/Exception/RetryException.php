<?php

declare(strict_types=1);

namespace Larder\Exception;

/**
 * A transaction failed in a way that running it again can cure:
 * SQLSTATE 40001 (serialization_failure; the front's answer when no
 * snapshot consistent with a read-only transaction's reads is left) or
 * 40P01 (deadlock_detected). Client::readOnly() throws it when its attempts
 * are used up; Client::readWrite() at once, leaving the retry to the caller.
 */
class RetryException extends QueryException
{
    private int $attempts;

    /**
     * @param array<string, string> $fields
     */
    public function __construct(string $message, ?string $sqlState, string $sql, int $attempts, array $fields = [], ?\Throwable $previous = null)
    {
        parent::__construct($message, $sqlState, $sql, $fields, $previous);
        $this->attempts = $attempts;
    }

    /** How many times the transaction ran. */
    public function getAttempts(): int
    {
        return $this->attempts;
    }

    /** Whether an error with this SQLSTATE is worth a retry. */
    public static function isRetryable(?string $sqlState): bool
    {
        return $sqlState === '40001' || $sqlState === '40P01';
    }
}
