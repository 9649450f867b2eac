<?php

declare(strict_types=1);

namespace Larder\Internal;

use Larder\Exception\QueryException;

/**
 * @internal A read-only transaction ran a statement by a name its
 * persistent session does not hold (26000): Client::readOnly() prepares it
 * outside the transaction and runs the transaction again. Never seen by
 * callers.
 */
final class PrepareNeeded extends QueryException
{
    public function __construct(public readonly string $name, string $sql, string $message)
    {
        parent::__construct($message, '26000', $sql);
    }
}
