<?php

declare(strict_types=1);

namespace Rubis;

/**
 * An interaction's answer other than its page: not found (404), bad
 * parameters (400), not logged in (401), a conflict (409). Any other
 * exception is a 500.
 */
final class HttpError extends \RuntimeException
{
    public function __construct(public readonly int $status, string $message)
    {
        parent::__construct($message);
    }
}
