<?php

declare(strict_types=1);

namespace Larder\Tests;

use Larder\Client;
use Larder\Exception\ConnectionException;
use Larder\Exception\LarderException;
use Larder\Exception\QueryException;
use Larder\Exception\RetryException;

/** The library against PostgreSQL itself ("direct"). */
final class ClientTest extends TestCase
{
    private function client(array $options = []): Client
    {
        return new Client(self::postgres(), $options + ['direct' => true]);
    }

    public function testQueryHelpers(): void
    {
        $db = $this->client();
        $r = $db->query('SELECT id, owner, balance FROM accounts WHERE balance >= $1 ORDER BY id', [50]);
        self::assertSame(['id', 'owner', 'balance'], $r->fields());
        self::assertSame([23, 25, 20], $r->types());
        self::assertSame([['1', 'ann', '100'], ['2', 'bob', '50']], $r->rows());
        self::assertSame('SELECT 2', $r->commandTag());
        self::assertSame(['id' => '1', 'owner' => 'ann', 'balance' => '100'], $db->queryRow('SELECT * FROM accounts WHERE id = $1', [1]));
        self::assertNull($db->queryRow('SELECT * FROM accounts WHERE id = $1', [99]));
        self::assertSame('bob', $db->queryValue('SELECT owner FROM accounts WHERE id = $1', [2]));
        self::assertNull($db->queryValue('SELECT NULL'));
        self::assertSame(2, $db->execute('UPDATE accounts SET balance = balance + 1 WHERE id <= $1', [2]));
    }

    public function testParameterTypes(): void
    {
        $db = $this->client();
        $stringable = new class () {
            public function __toString(): string
            {
                return 'str';
            }
        };
        $row = $db->queryRow('SELECT $1::int IS NULL AS n, $2::bool AS t, $3::bool AS f, $4::bigint AS i, $5::float8 AS x,
            $6::timestamptz AT TIME ZONE \'UTC\' AS ts, $7::text AS s, $8::float8 AS inf, $9::text AS plain',
            [null, true, false, PHP_INT_MAX, 0.1, new \DateTimeImmutable('2024-02-03 04:05:06.789', new \DateTimeZone('UTC')), $stringable, -INF, 'a\'b']);
        self::assertSame(['n' => 't', 't' => 't', 'f' => 'f', 'i' => (string) PHP_INT_MAX, 'x' => '0.1',
            'ts' => '2024-02-03 04:05:06.789', 's' => 'str', 'inf' => '-Infinity', 'plain' => 'a\'b'], $row);
    }

    public function testUnsupportedParameter(): void
    {
        $this->expectException(\InvalidArgumentException::class);
        $this->client()->query('SELECT $1', [[1, 2]]);
    }

    public function testErrorsCarrySqlState(): void
    {
        $db = $this->client();
        try {
            $db->query('SELECT * FROM no_such_table');
            self::fail('no error');
        } catch (QueryException $e) {
            self::assertSame('42P01', $e->getSqlState());
            self::assertSame('SELECT * FROM no_such_table', $e->getSql());
            self::assertStringContainsString('no_such_table', $e->getMessage());
            self::assertStringContainsString('SQLSTATE 42P01', $e->getMessage());
            self::assertNotInstanceOf(RetryException::class, $e);
        }
        try {
            $db->execute('INSERT INTO accounts VALUES ($1, $2, $3)', [1, 'dup', 0]);
            self::fail('no error');
        } catch (QueryException $e) {
            self::assertSame('23505', $e->getSqlState());
            self::assertSame('accounts_pkey', $e->getConstraint());
            self::assertSame('accounts', $e->getFields()['table'] ?? null);
            self::assertNotNull($e->getDetail());
        }
        // The session goes on.
        self::assertSame('1', $db->queryValue('SELECT 1'));
    }

    public function testEveryErrorIsALarderException(): void
    {
        foreach ([QueryException::class, RetryException::class, ConnectionException::class] as $class) {
            self::assertTrue(is_subclass_of($class, LarderException::class), $class);
        }
    }

    public function testReadOnlyReturnsWhatTheFunctionReturns(): void
    {
        $db = $this->client();
        $seen = null;
        $v = $db->readOnly(30, static function (Client $tx) use (&$seen): string {
            $seen = $tx->inTransaction();
            return (string) $tx->queryValue('SELECT owner FROM accounts WHERE id = $1', [3]);
        });
        self::assertSame('cy', $v);
        self::assertTrue($seen);
        self::assertFalse($db->inTransaction());
        self::assertSame(PGSQL_TRANSACTION_IDLE, pg_transaction_status($db->connection()));
    }

    public function testReadOnlyRefusesWrites(): void
    {
        $db = $this->client();
        try {
            $db->readOnly(30, static fn (Client $tx) => $tx->execute('UPDATE accounts SET balance = 0'));
            self::fail('no error');
        } catch (QueryException $e) {
            self::assertSame('25006', $e->getSqlState());
        }
        self::assertSame('100', $db->queryValue('SELECT balance FROM accounts WHERE id = 1'));
    }

    public function testDirectDoesNotSetStaleness(): void
    {
        // On plain PostgreSQL larder.staleness is an unknown setting unless
        // set: the direct client leaves it alone...
        try {
            $this->client()->readOnly(30, static fn (Client $tx) => $tx->queryValue('SHOW larder.staleness'));
            self::fail('larder.staleness was set');
        } catch (QueryException $e) {
            self::assertSame('42704', $e->getSqlState());
        }
        // ...a front's client sets it for the transaction only.
        $db = $this->client(['direct' => false]);
        self::assertSame('1500ms', $db->readOnly(1.5, static fn (Client $tx) => $tx->queryValue('SHOW larder.staleness')));
        self::assertSame('', (string) $db->queryValue("SELECT current_setting('larder.staleness', true)"));
    }

    public function testReadOnlyRunsAgainOnSerializationFailure(): void
    {
        $db = $this->client();
        $runs = 0;
        $v = $db->readOnly(30, static function (Client $tx) use (&$runs): string {
            if (++$runs < 3) {
                $tx->query("DO \$\$ BEGIN RAISE EXCEPTION 'run me again' USING ERRCODE = '40001'; END \$\$");
            }
            return (string) $tx->queryValue('SELECT balance FROM accounts WHERE id = 2');
        });
        self::assertSame('50', $v);
        self::assertSame(3, $runs);
    }

    public function testReadOnlyGivesUpAfterItsAttempts(): void
    {
        foreach ([[], ['attempts' => 5]] as $options) {
            $db = $this->client($options);
            $runs = 0;
            try {
                $db->readOnly(30, static function (Client $tx) use (&$runs): void {
                    $runs++;
                    $tx->query("DO \$\$ BEGIN RAISE EXCEPTION 'never' USING ERRCODE = '40001'; END \$\$");
                });
                self::fail('no error');
            } catch (RetryException $e) {
                $want = $options['attempts'] ?? Client::DEFAULT_ATTEMPTS;
                self::assertSame('40001', $e->getSqlState());
                self::assertSame($want, $e->getAttempts());
                self::assertSame($want, $runs);
                self::assertInstanceOf(QueryException::class, $e->getPrevious());
            }
            self::assertSame(PGSQL_TRANSACTION_IDLE, pg_transaction_status($db->connection()));
        }
    }

    public function testAnErrorCaughtInsideIsTheOutcome(): void
    {
        $db = $this->client();
        $runs = 0;
        // The function swallows the failure; the transaction still retries.
        $v = $db->readOnly(30, static function (Client $tx) use (&$runs): int {
            $runs++;
            try {
                if ($runs === 1) {
                    $tx->query("DO \$\$ BEGIN RAISE EXCEPTION 'again' USING ERRCODE = '40001'; END \$\$");
                }
            } catch (RetryException) {
            }
            return $runs;
        });
        self::assertSame(2, $v);
        // A write whose failure was swallowed does not commit its other statements.
        try {
            $db->readWrite(static function (Client $tx): void {
                $tx->execute('UPDATE accounts SET balance = 1 WHERE id = 1');
                try {
                    $tx->execute('INSERT INTO accounts VALUES (2, $1, 0)', ['dup']);
                } catch (QueryException) {
                }
            });
            self::fail('no error');
        } catch (QueryException $e) {
            self::assertSame('23505', $e->getSqlState());
        }
        self::assertSame('100', $db->queryValue('SELECT balance FROM accounts WHERE id = 1'));
    }

    public function testReadWriteCommitsOrRollsBack(): void
    {
        $db = $this->client();
        $n = $db->readWrite(static fn (Client $tx) => $tx->execute('UPDATE accounts SET balance = balance - 10 WHERE id = $1', [1]));
        self::assertSame(1, $n);
        self::assertSame('90', $this->client()->queryValue('SELECT balance FROM accounts WHERE id = 1'));
        try {
            $db->readWrite(static function (Client $tx): void {
                $tx->execute('UPDATE accounts SET balance = 0 WHERE id = 1');
                throw new \DomainException('changed my mind');
            });
            self::fail('no error');
        } catch (\DomainException $e) {
            self::assertSame('changed my mind', $e->getMessage());
        }
        self::assertSame('90', $this->client()->queryValue('SELECT balance FROM accounts WHERE id = 1'));
    }

    public function testReadWriteLeavesRetriesToTheCaller(): void
    {
        $db = $this->client();
        $runs = 0;
        try {
            $db->readWrite(static function (Client $tx) use (&$runs): void {
                $runs++;
                $tx->query("DO \$\$ BEGIN RAISE EXCEPTION 'conflict' USING ERRCODE = '40001'; END \$\$");
            });
            self::fail('no error');
        } catch (RetryException $e) {
            self::assertSame('40001', $e->getSqlState());
            self::assertSame(1, $e->getAttempts());
        }
        self::assertSame(1, $runs);
    }

    public function testNoNestedTransactions(): void
    {
        $db = $this->client();
        $this->expectException(\LogicException::class);
        $db->readWrite(static fn (Client $tx) => $tx->readOnly(1, static fn () => null));
    }

    public function testInvalidArguments(): void
    {
        foreach ([static fn () => new Client('x', ['nope' => 1]), static fn () => new Client('x', ['attempts' => 0]),
            fn () => $this->client()->readOnly(0, static fn () => null), fn () => $this->client()->readOnly(NAN, static fn () => null)] as $i => $f) {
            try {
                $f();
                self::fail("case $i: no error");
            } catch (\InvalidArgumentException) {
                self::addToAssertionCount(1);
            }
        }
    }

    public function testConnectionRefused(): void
    {
        $db = new Client('host=127.0.0.1 port=1 dbname=x user=x connect_timeout=2');
        try {
            $db->query('SELECT 1');
            self::fail('no error');
        } catch (ConnectionException $e) {
            self::assertSame('08001', $e->getSqlState());
            self::assertStringContainsString('127.0.0.1', $e->getMessage());
        }
    }

    public function testLostConnectionIsReopenedForAReadOnlyTransaction(): void
    {
        $db = $this->client();
        $pids = [];
        $v = $db->readOnly(30, static function (Client $tx) use (&$pids): string {
            $pids[] = $tx->queryValue('SELECT pg_backend_pid()');
            if (count($pids) === 1) {
                $tx->query('SELECT pg_terminate_backend(pg_backend_pid())');
            }
            return (string) $tx->queryValue('SELECT owner FROM accounts WHERE id = 1');
        });
        self::assertSame('ann', $v);
        self::assertCount(2, $pids);
        self::assertNotSame($pids[0], $pids[1]);
        // Outside readOnly a lost connection is the caller's to handle.
        try {
            $db->query('SELECT pg_terminate_backend(pg_backend_pid())');
            self::fail('no error');
        } catch (ConnectionException $e) {
            self::assertSame('08006', $e->getSqlState());
        }
        self::assertSame('1', $db->queryValue('SELECT 1'));
    }

    public function testPersistentConnectionsAreShared(): void
    {
        $a = $this->client(['persistent' => true]);
        $b = $this->client(['persistent' => true]);
        self::assertSame($a->queryValue('SELECT pg_backend_pid()'), $b->queryValue('SELECT pg_backend_pid()'));
        $c = $this->client();
        $d = $this->client();
        self::assertNotSame($c->queryValue('SELECT pg_backend_pid()'), $d->queryValue('SELECT pg_backend_pid()'));
    }

    public function testPreparedStatementsOncePerSession(): void
    {
        $db = $this->client(['prepare' => true]);
        $sql = 'SELECT owner FROM accounts WHERE id = $1';
        self::assertSame('ann', $db->queryValue($sql, [1]));
        self::assertSame('bob', $db->readOnly(30, static fn (Client $tx) => $tx->queryValue($sql, [2])));
        self::assertSame(['larder_' . md5($sql) => $sql], $this->preparedOn($db));
        // Without the option nothing is prepared.
        $plain = $this->client();
        $plain->queryValue($sql, [1]);
        self::assertSame([], $this->preparedOn($plain));
    }

    public function testPersistentSessionsPrepareWhatTheyLack(): void
    {
        $sql = 'SELECT balance FROM accounts WHERE id = $1';
        $read = static function (Client $db, ?int &$runs) use ($sql): string {
            $runs = 0;
            return $db->readOnly(30, static function (Client $tx) use ($sql, &$runs): string {
                $runs++;
                return (string) $tx->queryValue($sql, [1]);
            });
        };
        // A request's client on a persistent session that lacks the
        // statement: the transaction runs again once it is prepared.
        $first = $this->client(['persistent' => true]);
        pg_query($first->connection(), 'DEALLOCATE ALL');
        self::assertSame('100', $read($first, $runs));
        self::assertSame(2, $runs);
        // The next request's client finds it there.
        $next = $this->client(['persistent' => true]);
        self::assertSame('100', $read($next, $runs));
        self::assertSame(1, $runs);
        self::assertArrayHasKey('larder_' . md5($sql), $this->preparedOn($next));
        // Outside transactions it is prepared and run at once; in a
        // read/write transaction an unknown statement runs unnamed.
        pg_query($next->connection(), 'DEALLOCATE ALL');
        self::assertSame('100', (string) $this->client(['persistent' => true])->queryValue($sql, [1]));
        pg_query($next->connection(), 'DEALLOCATE ALL');
        self::assertSame(1, $this->client(['persistent' => true])->readWrite(static fn (Client $tx) => $tx->execute('UPDATE accounts SET balance = 7 WHERE id = $1', [3])));
        self::assertSame([], $this->preparedOn($next));
    }

    /** @return array<string, string> the session's prepared statements */
    private function preparedOn(Client $db): array
    {
        $out = [];
        foreach (pg_fetch_all(pg_query($db->connection(), 'SELECT name, statement FROM pg_prepared_statements')) as $row) {
            $out[$row['name']] = $row['statement'];
        }
        return $out;
    }

    public function testStalenessFormat(): void
    {
        self::assertSame('30s', Client::formatStaleness(30));
        self::assertSame('1s', Client::formatStaleness(1.0));
        self::assertSame('500ms', Client::formatStaleness(0.5));
        self::assertSame('1250ms', Client::formatStaleness(1.25));
        self::assertSame('1ms', Client::formatStaleness(0.0001));
    }
}
