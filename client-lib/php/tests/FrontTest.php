<?php

declare(strict_types=1);

namespace Larder\Tests;

use Larder\Client;
use Larder\Exception\QueryException;

/** The library through the Larder front (LARDER_TEST_FRONT). */
final class FrontTest extends TestCase
{
    private Client $db;

    protected function setUp(): void
    {
        // The reset runs on this test's own session through the front, so
        // that its read-only transactions see it at once (read your writes).
        $this->db = new Client(self::front());
        $this->db->readWrite(static function (Client $db): void {
            $db->execute('DELETE FROM accounts');
            $db->execute("INSERT INTO accounts VALUES (1, 'ann', 100), (2, 'bob', 50), (3, 'cy', 0)");
        });
    }

    protected function tearDown(): void
    {
        $this->db->close();
    }

    public function testReadOnlyAnswersAsPostgres(): void
    {
        $direct = new Client(self::postgres(), ['direct' => true]);
        $want = $direct->query('SELECT owner, balance FROM accounts WHERE id = $1', [1]);
        // The first a miss, the others hits: the same answer each time.
        for ($i = 0; $i < 5; $i++) {
            $got = $this->db->readOnly(30, static fn (Client $tx) => $tx->query('SELECT owner, balance FROM accounts WHERE id = $1', [1]));
            self::assertSame($want->fields(), $got->fields());
            self::assertSame($want->types(), $got->types());
            self::assertSame($want->rows(), $got->rows());
            self::assertSame('SELECT 1', $got->commandTag());
        }
    }

    public function testPreparedStatementsThroughTheFront(): void
    {
        // Named statements prepared once per session, answered from the
        // cache like unnamed ones; a persistent session that lacks one
        // (DEALLOCATE ALL) gets it prepared and the transaction run again.
        $sql = 'SELECT owner, balance FROM accounts WHERE id = $1';
        $want = [['ann', '100']];
        $db = new Client(self::front(), ['prepare' => true]);
        for ($i = 0; $i < 3; $i++) {
            self::assertSame($want, $db->readOnly(30, static fn (Client $tx) => $tx->query($sql, [1])->rows()));
        }
        $p = new Client(self::front(), ['persistent' => true]);
        pg_query($p->connection(), 'DEALLOCATE ALL');
        $runs = 0;
        $read = static function (Client $tx) use ($sql, &$runs): array {
            $runs++;
            return $tx->query($sql, [1])->rows();
        };
        self::assertSame($want, $p->readOnly(30, $read));
        self::assertSame(2, $runs);
        $runs = 0;
        self::assertSame($want, (new Client(self::front(), ['persistent' => true]))->readOnly(30, $read));
        self::assertSame(1, $runs);
    }

    public function testStalenessIsTheTransactions(): void
    {
        self::assertSame('30s', $this->db->readOnly(30, static fn (Client $tx) => $tx->queryValue('SHOW larder.staleness')));
        self::assertSame('250ms', $this->db->readOnly(0.25, static fn (Client $tx) => $tx->queryValue('SHOW larder.staleness')));
    }

    public function testWritesAreRefusedInReadOnly(): void
    {
        try {
            $this->db->readOnly(30, static fn (Client $tx) => $tx->execute('UPDATE accounts SET balance = 0 WHERE id = $1', [1]));
            self::fail('no error');
        } catch (QueryException $e) {
            self::assertSame('25006', $e->getSqlState());
        }
        self::assertSame('100', $this->db->readOnly(30, static fn (Client $tx) => $tx->queryValue('SELECT balance FROM accounts WHERE id = $1', [1])));
    }

    public function testReadYourWrites(): void
    {
        $read = static fn (Client $tx) => $tx->queryValue('SELECT balance FROM accounts WHERE id = $1', [2]);
        self::assertSame('50', $this->db->readOnly(30, $read));
        self::assertSame('50', $this->db->readOnly(30, $read)); // cached
        $this->db->readWrite(static fn (Client $tx) => $tx->execute('UPDATE accounts SET balance = balance + $1 WHERE id = $2', [25, 2]));
        self::assertSame('75', $this->db->readOnly(30, $read));
        // A write outside readWrite moves the session too.
        $this->db->execute('UPDATE accounts SET balance = 0 WHERE id = $1', [2]);
        self::assertSame('0', $this->db->readOnly(30, $read));
    }

    public function testErrorsCarrySqlState(): void
    {
        try {
            $this->db->readOnly(30, static fn (Client $tx) => $tx->query('SELECT * FROM no_such_table'));
            self::fail('no error');
        } catch (QueryException $e) {
            self::assertSame('42P01', $e->getSqlState());
        }
        try {
            $this->db->query('SELECT 1/0');
            self::fail('no error');
        } catch (QueryException $e) {
            self::assertSame('22012', $e->getSqlState());
        }
        self::assertSame('3', $this->db->readOnly(30, static fn (Client $tx) => $tx->queryValue('SELECT count(*) FROM accounts')));
    }

    public function testStatementsOtherThanQueriesAreRefused(): void
    {
        try {
            $this->db->readOnly(30, static fn (Client $tx) => $tx->query('SAVEPOINT s'));
            self::fail('no error');
        } catch (QueryException $e) {
            self::assertSame('0A000', $e->getSqlState());
        }
        self::assertSame('ann', $this->db->readOnly(30, static fn (Client $tx) => $tx->queryValue('SELECT owner FROM accounts WHERE id = $1', [1])));
    }
}
