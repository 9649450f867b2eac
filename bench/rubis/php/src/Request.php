<?php

declare(strict_types=1);

namespace Rubis;

/**
 * One request being served: its form values, read as Go's
 * Request.FormValue reads them (a url-encoded body's values before the
 * query string's, the first value of a repeated name, a malformed pair
 * skipped), and the page it renders.
 */
final class Request
{
    /** @var array<string, string> the first value of each name */
    private array $form = [];

    public string $title;

    public string $message = '';

    /** @var list<array{title: string, columns: list<string>, rows: list<list<string>>}> */
    public array $sections = [];

    public function __construct(string $title, string $query, string $contentType = '', string $body = '')
    {
        $this->title = $title;
        $mediaType = strtolower(trim(explode(';', $contentType, 2)[0]));
        if ($mediaType === 'application/x-www-form-urlencoded') {
            $this->parse($body);
        }
        $this->parse($query);
    }

    /** The first value of a form field, or "". */
    public function form(string $name): string
    {
        return $this->form[$name] ?? '';
    }

    /** A field as Go's strconv.Atoi reads it; 400 otherwise. */
    public function intParam(string $name): int
    {
        $v = $this->form($name);
        $n = self::atoi($v);
        if ($n === null) {
            throw new HttpError(400, sprintf('parameter %s=%s is not a number', $name, Render::goQuote($v)));
        }
        return $n;
    }

    /** A field as Go's strconv.ParseFloat reads it; 400 otherwise. */
    public function floatParam(string $name): float
    {
        $v = $this->form($name);
        $f = self::parseFloat($v);
        if ($f === null) {
            throw new HttpError(400, sprintf('parameter %s=%s is not a number', $name, Render::goQuote($v)));
        }
        return $f;
    }

    /** strconv.Atoi: an optional sign and decimal digits, within 64 bits; null otherwise. */
    public static function atoi(string $v): ?int
    {
        if (preg_match('/^([+-]?)0*([0-9]+)$/D', $v, $m) !== 1) {
            return null;
        }
        $digits = $m[2];
        $limit = $m[1] === '-' ? '9223372036854775808' : '9223372036854775807';
        if (strlen($digits) > 19 || (strlen($digits) === 19 && strcmp($digits, $limit) > 0)) {
            return null;
        }
        if ($m[1] === '-' && $digits === '9223372036854775808') {
            return PHP_INT_MIN;
        }
        return $m[1] === '-' ? -(int) $digits : (int) $digits;
    }

    /**
     * strconv.ParseFloat for decimal forms (with Go's underscores between
     * digits), inf, infinity and nan; null for
     * anything else and for a finite form out of range. (Go's hexadecimal
     * floats are not read.)
     */
    public static function parseFloat(string $v): ?float
    {
        if (preg_match('/^[+-]?(inf|infinity)$/Di', $v) === 1) {
            return $v[0] === '-' ? -INF : INF;
        }
        if (preg_match('/^[+-]?nan$/Di', $v) === 1) {
            return NAN;
        }
        // Go's decimal literal: underscores only between digits.
        $d = '[0-9](?:_?[0-9])*';
        if (preg_match("/^[+-]?(?:$d(?:\\.(?:$d)?)?|\\.$d)(?:[eE][+-]?$d)?$/D", $v) !== 1) {
            return null;
        }
        $f = (float) str_replace('_', '', $v);
        return is_infinite($f) ? null : $f;
    }

    /** Go's url.ParseQuery, keeping the first value of each name. */
    private function parse(string $q): void
    {
        foreach (explode('&', $q) as $pair) {
            if ($pair === '' || str_contains($pair, ';')) {
                continue;
            }
            $kv = explode('=', $pair, 2);
            $k = self::unescape($kv[0]);
            $v = self::unescape($kv[1] ?? '');
            if ($k === null || $v === null || array_key_exists($k, $this->form)) {
                continue;
            }
            $this->form[$k] = $v;
        }
    }

    /** url.QueryUnescape: null for a malformed escape. */
    private static function unescape(string $s): ?string
    {
        if (str_contains($s, '%') && preg_match('/%(?![0-9a-fA-F]{2})/', $s) === 1) {
            return null;
        }
        return urldecode($s);
    }
}
