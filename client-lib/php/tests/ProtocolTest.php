<?php

declare(strict_types=1);

namespace Larder\Tests;

/**
 * PHP's two PostgreSQL drivers, pgsql (libpq) and PDO_pgsql, run their
 * usual flows through the Larder front as against PostgreSQL: prepared
 * statements, read-only and read/write transactions, errors in the middle
 * of a transaction, COPY and cancel.
 */
final class ProtocolTest extends TestCase
{
    /** A PDO connection to the database a URL names. */
    private static function pdo(string $url): \PDO
    {
        $u = parse_url($url);
        $dsn = sprintf('pgsql:host=%s;port=%d;dbname=%s', $u['host'], $u['port'] ?? 5432, ltrim($u['path'] ?? '/postgres', '/'));
        return new \PDO($dsn, $u['user'] ?? 'postgres', $u['pass'] ?? null, [\PDO::ATTR_ERRMODE => \PDO::ERRMODE_EXCEPTION]);
    }

    public function testPdoPreparedStatementsAndTransactions(): void
    {
        $direct = self::pdo(self::postgres());
        $front = self::pdo(self::front());
        $sql = 'SELECT owner, balance FROM accounts WHERE id = ?';
        $want = $direct->prepare($sql);
        $want->execute([2]);
        $wantRows = $want->fetchAll(\PDO::FETCH_NUM);
        for ($i = 0; $i < 3; $i++) {
            $front->exec('BEGIN READ ONLY');
            // setUp wrote the rows on another session: a snapshot within
            // the default 30 s may predate them (an earlier test's rows).
            $front->exec("SET LOCAL larder.staleness = '1ms'");
            $st = $front->prepare($sql);
            $st->execute([2]);
            self::assertSame($wantRows, $st->fetchAll(\PDO::FETCH_NUM));
            $front->exec('COMMIT');
        }
        // PDO's own transactions (read/write) are PostgreSQL's.
        $front->beginTransaction();
        $front->prepare('UPDATE accounts SET balance = balance + ? WHERE id = ?')->execute([5, 2]);
        $front->commit();
        $front->exec('BEGIN READ ONLY');
        $st = $front->prepare($sql);
        $st->execute([2]);
        self::assertSame([['bob', 55]], $st->fetchAll(\PDO::FETCH_NUM), 'a read-only transaction sees its session\'s write');
        $front->exec('COMMIT');
    }

    public function testErrorsInTheMiddleOfTransactions(): void
    {
        foreach ([self::postgres(), self::front()] as $target) {
            $pdo = self::pdo($target);
            foreach (['BEGIN', 'BEGIN READ ONLY'] as $begin) {
                $pdo->exec($begin);
                try {
                    $pdo->query('SELECT 1 / (balance - balance) FROM accounts WHERE id = 1');
                    self::fail("$begin: no division by zero");
                } catch (\PDOException $e) {
                    self::assertSame('22012', $e->getCode(), $e->getMessage());
                }
                try {
                    $pdo->query('SELECT 1');
                    self::fail("$begin: a statement after an error ran");
                } catch (\PDOException $e) {
                    self::assertSame('25P02', $e->getCode(), $e->getMessage());
                }
                $pdo->exec('ROLLBACK');
                self::assertSame([[1]], $pdo->query('SELECT 1')->fetchAll(\PDO::FETCH_NUM));
            }
        }
    }

    public function testCopyThroughTheFront(): void
    {
        $c = pg_connect(self::front(), PGSQL_CONNECT_FORCE_NEW);
        self::assertNotFalse($c);
        self::assertTrue(pg_copy_from($c, 'accounts', ["10\tdee\t7\n", "11\teve\t8\n"]));
        $rows = pg_copy_to($c, '(SELECT id, owner FROM accounts WHERE id >= 10 ORDER BY id)');
        self::assertSame(["10\tdee\n", "11\teve\n"], $rows);
        $pdo = self::pdo(self::front());
        self::assertTrue($pdo->pgsqlCopyFromArray('accounts', ["12\tfay\t9"]));
        self::assertSame([[3]], $pdo->query('SELECT count(*) FROM accounts WHERE id >= 10')->fetchAll(\PDO::FETCH_NUM));
        pg_close($c);
    }

    public function testCancelThroughTheFront(): void
    {
        $c = pg_connect(self::front(), PGSQL_CONNECT_FORCE_NEW);
        self::assertNotFalse($c);
        $start = microtime(true);
        self::assertTrue(pg_send_query($c, 'SELECT pg_sleep(20)'));
        usleep(300000);
        // pg_cancel_query asks PostgreSQL (through the front) to cancel,
        // then reads and drops the query's result: it returns once the
        // query ended, long before its 20 s unless the cancel arrived.
        self::assertTrue(pg_cancel_query($c));
        self::assertLessThan(10, microtime(true) - $start, 'the cancel did not reach PostgreSQL');
        self::assertFalse(pg_connection_busy($c));
        // The session goes on.
        self::assertSame('1', pg_fetch_result(pg_query($c, 'SELECT 1'), 0, 0));
        pg_close($c);
    }
}
