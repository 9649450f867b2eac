<?php

declare(strict_types=1);

namespace Larder\Tests;

use Larder\Client;

/**
 * Opens clients on the servers the environment names and resets the
 * accounts table before each test.
 */
abstract class TestCase extends \PHPUnit\Framework\TestCase
{
    /** PostgreSQL itself (LARDER_TEST_PG). */
    protected static function postgres(): string
    {
        return self::env('LARDER_TEST_PG');
    }

    /** The Larder front before that PostgreSQL (LARDER_TEST_FRONT). */
    protected static function front(): string
    {
        return self::env('LARDER_TEST_FRONT');
    }

    private static function env(string $name): string
    {
        $v = getenv($name);
        if ($v === false || $v === '') {
            self::fail("$name is not set: the tests need a PostgreSQL and a Larder front (go test ./bench/rubis/php -run TestPHPUnit starts them)");
        }
        return $v;
    }

    protected function setUp(): void
    {
        $db = new Client(self::postgres(), ['direct' => true]);
        $db->readWrite(static function (Client $db): void {
            $db->execute('DELETE FROM accounts');
            $db->execute("INSERT INTO accounts VALUES (1, 'ann', 100), (2, 'bob', 50), (3, 'cy', 0)");
        });
        $db->close();
    }
}
