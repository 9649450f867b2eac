<?php

declare(strict_types=1);

namespace Larder;

use Larder\Exception\ConnectionException;
use Larder\Exception\QueryException;
use Larder\Exception\RetryException;
use Larder\Internal\PrepareNeeded;

/**
 * A connection to Larder's PostgreSQL front (larder-front) — or, with the
 * "direct" option, to PostgreSQL itself — on PHP's pgsql extension.
 *
 * readOnly() runs a function in a read-only transaction that the front
 * answers from Larder's caches at one consistent snapshot no older than the
 * staleness limit, and runs it again when the front asks (SQLSTATE 40001);
 * readWrite() runs one in an ordinary transaction on PostgreSQL. Statements
 * take their parameters apart from the SQL text ($1, $2, …), never spliced
 * into it.
 *
 * A Client is one database session; PHP runs one request at a time per
 * process, and a Client must not be shared between requests running at the
 * same time (there are none in PHP's usual servers). With the "persistent"
 * option the session outlives the request (pg_pconnect), so that a worker
 * does not open a connection per request.
 *
 * Read your writes: the front lets a session's read-only transactions see
 * that session's own earlier writes at once. Another session's (another
 * worker's) writes may be seen up to the staleness limit later.
 */
final class Client
{
    /** How many times readOnly() runs a transaction the front asks to retry. */
    public const DEFAULT_ATTEMPTS = 3;

    private string $conninfo;

    private bool $direct;

    private bool $persistent;

    private int $attempts;

    private bool $prepare;

    private ?\PgSql\Connection $conn = null;

    /** @var array<string, true> statements known to be prepared on the session, by name */
    private array $prepared = [];

    /** Whether the open transaction is readOnly()'s. */
    private bool $readOnlyTx = false;

    /** Whether readOnly() or readWrite() has a transaction open. */
    private bool $inTransaction = false;

    /** The first statement error of the open transaction, rethrown at its end. */
    private ?QueryException $txError = null;

    /**
     * @param string $conninfo a libpq connection string ("host=127.0.0.1 port=6432 dbname=app user=app")
     *                         or URI ("postgresql://app@127.0.0.1:6432/app"): the front's address
     * @param array{direct?: bool, persistent?: bool, attempts?: int, prepare?: bool} $options
     *        direct: the server is plain PostgreSQL, not the front: readOnly() does not
     *                set larder.staleness (false);
     *        persistent: keep the connection across requests with pg_pconnect (false);
     *        attempts: how many times readOnly() runs a transaction that must be retried
     *                  (DEFAULT_ATTEMPTS; at least 1);
     *        prepare: run statements as named prepared statements, prepared once per
     *                 session (as persistent: worth it when the session outlives the request)
     */
    public function __construct(string $conninfo, array $options = [])
    {
        $unknown = array_diff(array_keys($options), ['direct', 'persistent', 'attempts', 'prepare']);
        if ($unknown !== []) {
            throw new \InvalidArgumentException('Larder\Client: unknown option ' . implode(', ', $unknown));
        }
        $attempts = $options['attempts'] ?? self::DEFAULT_ATTEMPTS;
        if (!is_int($attempts) || $attempts < 1) {
            throw new \InvalidArgumentException('Larder\Client: attempts must be an integer of at least 1');
        }
        $this->conninfo = $conninfo;
        $this->direct = (bool) ($options['direct'] ?? false);
        $this->persistent = (bool) ($options['persistent'] ?? false);
        $this->attempts = $attempts;
        $this->prepare = (bool) ($options['prepare'] ?? $this->persistent);
    }

    /**
     * Runs $fn($this) in a read-only transaction whose reads are at most
     * $staleness seconds stale, and returns what it returns. When the front
     * cannot continue the transaction at one snapshot it fails it with
     * SQLSTATE 40001; the transaction then runs again, from the start, up to
     * the attempts option in all, after which RetryException is thrown. A
     * connection lost under way is opened again for the next attempt (a
     * read-only transaction can always be run again). $fn may therefore run
     * more than once: keep its effects outside the database idempotent.
     *
     * @template T
     * @param float $staleness seconds, positive
     * @param callable(Client): T $fn
     * @return T
     */
    public function readOnly(float $staleness, callable $fn): mixed
    {
        if (!is_finite($staleness) || $staleness <= 0) {
            throw new \InvalidArgumentException('Larder\Client::readOnly: the staleness must be a positive number of seconds');
        }
        $this->notInTransaction('readOnly');
        // One round trip: the front takes SET LOCAL before the first query.
        $begin = $this->direct ? 'BEGIN READ ONLY'
            : "BEGIN READ ONLY; SET LOCAL larder.staleness = '" . self::formatStaleness($staleness) . "'";
        $prepares = 0;
        for ($attempt = 1; ; $attempt++) {
            try {
                return $this->transaction($begin, $fn, true);
            } catch (PrepareNeeded $e) {
                // The session lacked a statement (first use on a persistent
                // session): prepared outside the transaction, which runs
                // again without counting an attempt. Bounded all the same.
                if (++$prepares > 256) {
                    throw new QueryException($e->getMessage(), $e->getSqlState(), $e->getSql());
                }
                $this->prepareStatement($e->name, $e->getSql());
                $attempt--;
            } catch (QueryException $e) {
                if (!RetryException::isRetryable($e->getSqlState())) {
                    throw $e;
                }
                if ($attempt >= $this->attempts) {
                    throw new RetryException(sprintf('%s (after %d attempts)', $e->getMessage(), $attempt),
                        $e->getSqlState(), $e->getSql(), $attempt, $e->getFields(), $e);
                }
            } catch (ConnectionException $e) {
                $this->close();
                if ($attempt >= $this->attempts) {
                    throw $e;
                }
            }
        }
    }

    /**
     * Runs $fn($this) in a read/write transaction on PostgreSQL and returns
     * what it returns; commits when it returns, rolls back when it throws.
     * A serialization failure or deadlock (40001, 40P01) is thrown as
     * RetryException: running the transaction again is the caller's choice.
     *
     * @template T
     * @param callable(Client): T $fn
     * @return T
     */
    public function readWrite(callable $fn): mixed
    {
        $this->notInTransaction('readWrite');
        try {
            return $this->transaction('BEGIN', $fn, false);
        } catch (QueryException $e) {
            if (RetryException::isRetryable($e->getSqlState()) && !$e instanceof RetryException) {
                throw new RetryException($e->getMessage(), $e->getSqlState(), $e->getSql(), 1, $e->getFields(), $e);
            }
            throw $e;
        }
    }

    /**
     * Runs one statement with its parameters and returns its whole result.
     * Parameters are bound as $1, $2, … (null is NULL; bool, int, float,
     * DateTimeInterface and Stringable are converted to PostgreSQL's text).
     *
     * @param list<mixed> $params
     */
    public function query(string $sql, array $params = []): Result
    {
        return $this->run($sql, $params, false);
    }

    /**
     * The first row of a query by column name, or null when it has none.
     *
     * @param list<mixed> $params
     * @return array<string, ?string>|null
     */
    public function queryRow(string $sql, array $params = []): ?array
    {
        return $this->run($sql, $params, false)->first();
    }

    /**
     * The first column of a query's first row, or null (no row, or NULL).
     *
     * @param list<mixed> $params
     */
    public function queryValue(string $sql, array $params = []): ?string
    {
        return $this->run($sql, $params, false)->value();
    }

    /**
     * Runs a statement that returns no rows worth reading (INSERT, UPDATE, …)
     * and returns how many rows it changed.
     *
     * @param list<mixed> $params
     */
    public function execute(string $sql, array $params = []): int
    {
        return $this->run($sql, $params, false)->affectedRows();
    }

    /** Whether readOnly() or readWrite() is running on this client. */
    public function inTransaction(): bool
    {
        return $this->inTransaction;
    }

    /** Whether the server is plain PostgreSQL (the "direct" option). */
    public function isDirect(): bool
    {
        return $this->direct;
    }

    /** The pgsql connection, opened if needed, for what the helpers do not cover. */
    public function connection(): \PgSql\Connection
    {
        return $this->conn();
    }

    /**
     * Closes the connection (a persistent one is only forgotten: PHP keeps
     * it for the next request). The next statement opens a new one.
     */
    public function close(): void
    {
        if ($this->conn !== null && !$this->persistent) {
            pg_close($this->conn);
        }
        $this->conn = null;
        $this->prepared = [];
        $this->inTransaction = false;
        $this->txError = null;
    }

    /**
     * larder.staleness's value for $seconds: whole seconds as "30s", else
     * milliseconds ("1500ms"), at least 1 ms.
     */
    public static function formatStaleness(float $seconds): string
    {
        if ($seconds >= 1 && $seconds === floor($seconds) && $seconds < PHP_INT_MAX) {
            return sprintf('%ds', (int) $seconds);
        }
        return sprintf('%dms', max(1, (int) round($seconds * 1000)));
    }

    /**
     * One attempt: $begin, $fn, COMMIT; any failure rolls back.
     *
     * @template T
     * @param callable(Client): T $fn
     * @return T
     */
    private function transaction(string $begin, callable $fn, bool $readOnly): mixed
    {
        $this->txError = null;
        $this->inTransaction = true;
        $this->readOnlyTx = $readOnly;
        try {
            $this->run($begin, [], true);
            $value = $fn($this);
            // A statement error that $fn caught left the transaction aborted:
            // COMMIT would only roll it back, so the error is the outcome.
            $conn = $this->conn();
            if (pg_transaction_status($conn) === PGSQL_TRANSACTION_INERROR && $this->txError !== null) {
                throw $this->txError;
            }
            $this->run('COMMIT', [], true);
            $this->inTransaction = false;
            return $value;
        } catch (\Throwable $e) {
            $this->rollback();
            throw $e;
        } finally {
            $this->inTransaction = false;
            $this->readOnlyTx = false;
            $this->txError = null;
        }
    }

    /** Ends whatever transaction the session has, ignoring errors. */
    private function rollback(): void
    {
        if ($this->conn === null || pg_connection_status($this->conn) !== PGSQL_CONNECTION_OK) {
            return;
        }
        if (pg_transaction_status($this->conn) !== PGSQL_TRANSACTION_IDLE) {
            @pg_query($this->conn, 'ROLLBACK');
        }
    }

    private function notInTransaction(string $what): void
    {
        if ($this->inTransaction) {
            throw new \LogicException("Larder\\Client::$what: a transaction is already running on this client");
        }
    }

    /**
     * Sends one statement (or, $simple, a string of statements in the simple
     * protocol) and reads every result; the first error is thrown.
     *
     * @param list<mixed> $params
     */
    private function run(string $sql, array $params, bool $simple): Result
    {
        $conn = $this->conn();
        if ($simple) {
            return $this->results($conn, $sql, @pg_send_query($conn, $sql));
        }
        $name = self::statementName($sql);
        $known = isset($this->prepared[$name]);
        // Unnamed, as parsed each time: without the prepare option, and in a
        // read/write transaction for a statement that may not exist yet (a
        // failed guess would abort it).
        if (!$this->prepare || (!$known && $this->inTransaction && !$this->readOnlyTx)) {
            return $this->results($conn, $sql, @pg_send_query_params($conn, $sql, self::encode($params)));
        }
        if (!$known && !$this->persistent) {
            // This client opened the session: it knows what it holds.
            $this->prepareStatement($name, $sql);
            $known = true;
        }
        try {
            $r = $this->results($conn, $sql, @pg_send_execute($conn, $name, self::encode($params)));
        } catch (QueryException $e) {
            if ($known || $e->getSqlState() !== '26000') {
                throw $e;
            }
            // A persistent session from earlier requests did not hold it.
            if ($this->inTransaction) {
                $e = new PrepareNeeded($name, $sql, $e->getMessage());
                $this->txError = $e;
                throw $e;
            }
            $this->prepareStatement($name, $sql);
            $r = $this->results($conn, $sql, @pg_send_execute($conn, $name, self::encode($params)));
        }
        $this->prepared[$name] = true;
        return $r;
    }

    /** Prepares a statement under its name; one already there is fine. */
    private function prepareStatement(string $name, string $sql): void
    {
        $conn = $this->conn();
        try {
            $this->results($conn, $sql, @pg_send_prepare($conn, $name, $sql));
        } catch (QueryException $e) {
            if ($e->getSqlState() !== '42P05') {
                throw $e;
            }
        }
        $this->prepared[$name] = true;
    }

    /** A statement's name on the session: its text's digest. */
    private static function statementName(string $sql): string
    {
        return 'larder_' . md5($sql);
    }

    /**
     * Reads every result of what was sent; the first error is thrown.
     *
     * @param bool|int $sent what pg_send_* returned
     */
    private function results(\PgSql\Connection $conn, string $sql, bool|int $sent): Result
    {
        if ($sent === false || $sent === 0) {
            throw $this->lost($conn, $sql);
        }
        $last = null;
        $error = null;
        while (($r = pg_get_result($conn)) !== false) {
            $status = pg_result_status($r);
            if ($status === PGSQL_FATAL_ERROR || $status === PGSQL_BAD_RESPONSE || $status === PGSQL_NONFATAL_ERROR) {
                $error ??= $r;
            } else {
                $last = $r;
            }
        }
        if (pg_connection_status($conn) !== PGSQL_CONNECTION_OK) {
            throw $this->lost($conn, $sql);
        }
        if ($error !== null) {
            $e = self::queryError($error, $sql);
            if ($this->inTransaction) {
                $this->txError ??= $e;
            }
            throw $e;
        }
        if ($last === null) {
            return new Result([], [], []); // an empty query string
        }
        return Result::fromPg($last);
    }

    private function conn(): \PgSql\Connection
    {
        if ($this->conn !== null) {
            return $this->conn;
        }
        $message = null;
        set_error_handler(static function (int $no, string $str) use (&$message): bool {
            $message = $str;
            return true;
        });
        try {
            $conn = $this->persistent ? pg_pconnect($this->conninfo) : pg_connect($this->conninfo, PGSQL_CONNECT_FORCE_NEW);
        } finally {
            restore_error_handler();
        }
        if ($conn === false) {
            throw new ConnectionException('Larder\Client: connecting failed: ' . self::stripFunction($message ?? 'unknown error'), '08001');
        }
        if ($this->persistent) {
            // A persistent connection may have been broken since the last
            // request used it (a restarted front): open it again.
            if (pg_connection_status($conn) !== PGSQL_CONNECTION_OK && !@pg_connection_reset($conn)) {
                throw new ConnectionException('Larder\Client: reconnecting failed: ' . pg_last_error($conn), '08001');
            }
            // PHP rolls back what a request left open; a failed request may
            // still leave an aborted transaction behind.
            if (pg_transaction_status($conn) !== PGSQL_TRANSACTION_IDLE) {
                @pg_query($conn, 'ROLLBACK');
            }
        }
        $this->conn = $conn;
        $this->prepared = [];
        return $conn;
    }

    /** The error of a connection that broke, which is then forgotten. */
    private function lost(\PgSql\Connection $conn, string $sql): ConnectionException
    {
        $message = trim((string) @pg_last_error($conn));
        $this->conn = null;
        $this->prepared = [];
        if ($this->persistent) {
            // The next pg_pconnect in this process must not get it back broken.
            @pg_connection_reset($conn);
        }
        return new ConnectionException('Larder\Client: the connection was lost' . ($message !== '' ? ': ' . $message : '') . ' (running: ' . self::clip($sql) . ')', '08006');
    }

    private static function queryError(\PgSql\Result $r, string $sql): QueryException
    {
        $state = pg_result_error_field($r, PGSQL_DIAG_SQLSTATE);
        $state = is_string($state) && $state !== '' ? $state : null;
        $primary = pg_result_error_field($r, PGSQL_DIAG_MESSAGE_PRIMARY);
        $primary = is_string($primary) && $primary !== '' ? $primary : trim((string) pg_result_error($r));
        $fields = [];
        foreach (self::fieldCodes() as $name => $code) {
            $v = pg_result_error_field($r, $code);
            if (is_string($v) && $v !== '') {
                $fields[$name] = $v;
            }
        }
        $severity = $fields['severity'] ?? 'ERROR';
        $message = sprintf('%s: %s%s', $severity, $primary, $state !== null ? " (SQLSTATE $state)" : '');
        if (RetryException::isRetryable($state)) {
            return new RetryException($message, $state, $sql, 1, $fields);
        }
        return new QueryException($message, $state, $sql, $fields);
    }

    /** @return array<string, int> the error fields the exceptions carry */
    private static function fieldCodes(): array
    {
        $codes = ['severity' => PGSQL_DIAG_SEVERITY, 'detail' => PGSQL_DIAG_MESSAGE_DETAIL, 'hint' => PGSQL_DIAG_MESSAGE_HINT,
            'position' => PGSQL_DIAG_STATEMENT_POSITION, 'context' => PGSQL_DIAG_CONTEXT];
        foreach (['schema' => 'PGSQL_DIAG_SCHEMA_NAME', 'table' => 'PGSQL_DIAG_TABLE_NAME', 'column' => 'PGSQL_DIAG_COLUMN_NAME',
            'datatype' => 'PGSQL_DIAG_DATATYPE_NAME', 'constraint' => 'PGSQL_DIAG_CONSTRAINT_NAME'] as $name => $constant) {
            if (defined($constant)) {
                $codes[$name] = constant($constant);
            }
        }
        return $codes;
    }

    /**
     * PostgreSQL's text form of each parameter.
     *
     * @param list<mixed> $params
     * @return list<?string>
     */
    private static function encode(array $params): array
    {
        $out = [];
        foreach ($params as $i => $p) {
            $out[] = match (true) {
                $p === null => null,
                is_string($p) => $p,
                is_bool($p) => $p ? 't' : 'f',
                is_int($p) => (string) $p,
                is_float($p) => is_nan($p) ? 'NaN' : (is_infinite($p) ? ($p > 0 ? 'Infinity' : '-Infinity') : var_export($p, true)),
                $p instanceof \DateTimeInterface => $p->format('Y-m-d H:i:s.uP'),
                $p instanceof \Stringable => (string) $p,
                default => throw new \InvalidArgumentException(sprintf('Larder\Client: parameter %s is a %s, which has no PostgreSQL text form', is_int($i) ? '$' . ($i + 1) : $i, get_debug_type($p))),
            };
        }
        return $out;
    }

    private static function stripFunction(string $warning): string
    {
        return preg_replace('/^pg_p?connect\(\): /', '', $warning) ?? $warning;
    }

    private static function clip(string $sql): string
    {
        $sql = preg_replace('/\s+/', ' ', $sql) ?? $sql;
        return strlen($sql) > 80 ? substr($sql, 0, 77) . '...' : $sql;
    }
}
