<?php

declare(strict_types=1);

namespace Larder\Exception;

/**
 * The connection to the front (or to PostgreSQL) could not be opened or
 * was lost. A transaction under way when it broke has not committed, or
 * its outcome is unknown (a COMMIT without an answer).
 */
class ConnectionException extends LarderException
{
}
