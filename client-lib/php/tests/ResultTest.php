<?php

declare(strict_types=1);

namespace Larder\Tests;

use Larder\Result;
use PHPUnit\Framework\TestCase as BaseTestCase;

final class ResultTest extends BaseTestCase
{
    private function result(): Result
    {
        return new Result(['id', 'name', 'id'], [23, 25, 20], [['1', 'ann', '10'], ['2', null, '20']], 2, 'SELECT 2');
    }

    public function testAccessors(): void
    {
        $r = $this->result();
        self::assertSame(['id', 'name', 'id'], $r->fields());
        self::assertSame([23, 25, 20], $r->types());
        self::assertSame([['1', 'ann', '10'], ['2', null, '20']], $r->rows());
        self::assertCount(2, $r);
        self::assertSame('SELECT 2', $r->commandTag());
        self::assertSame(2, $r->affectedRows());
        self::assertSame('1', $r->value());
    }

    public function testByName(): void
    {
        $r = $this->result();
        // A later column of the same name wins; rows() keeps both.
        self::assertSame(['id' => '10', 'name' => 'ann'], $r->first());
        self::assertSame([['id' => '10', 'name' => 'ann'], ['id' => '20', 'name' => null]], $r->assoc());
        self::assertSame(['ann', null], $r->column('name'));
        self::assertSame(['10', '20'], $r->column(2));
        self::assertSame([['id' => '10', 'name' => 'ann'], ['id' => '20', 'name' => null]], iterator_to_array($r));
    }

    public function testEmpty(): void
    {
        $r = new Result(['a'], [23], []);
        self::assertNull($r->first());
        self::assertNull($r->value());
        self::assertSame([], $r->column('a'));
        self::assertCount(0, $r);
    }

    public function testUnknownColumn(): void
    {
        $this->expectException(\OutOfRangeException::class);
        $this->result()->column('nope');
    }
}
