<?php

declare(strict_types=1);

namespace Rubis;

/**
 * Renders pages byte for byte as the Go application does (app.go's page
 * template under html/template, its render function over pgx's values, and
 * net/http's error pages).
 */
final class Render
{
    // PostgreSQL type OIDs whose text form the Go application shows otherwise.
    private const BOOL = 16;
    private const BYTEA = 17;
    private const FLOAT4 = 700;
    private const FLOAT8 = 701;
    private const DATE = 1082;
    private const TIMESTAMP = 1114;
    private const TIMESTAMPTZ = 1184;

    /** html/template's escaping of text (its htmlReplacementTable). */
    private const HTML = ["\0" => "\u{FFFD}", '"' => '&#34;', '&' => '&amp;', "'" => '&#39;', '+' => '&#43;', '<' => '&lt;', '>' => '&gt;'];

    /**
     * The page: app.go's pageTemplate.
     *
     * @param list<array{title: string, columns: list<string>, rows: list<list<string>>}> $sections
     */
    public static function page(string $title, string $message, array $sections): string
    {
        $t = self::html($title);
        $out = "<!DOCTYPE html>\n<html><head><title>RUBiS: $t</title></head><body>\n<h1>$t</h1>";
        if ($message !== '') {
            $out .= '<p class="message">' . self::html($message) . '</p>';
        }
        $out .= "\n";
        foreach ($sections as $s) {
            $out .= '<h2>' . self::html($s['title']) . '</h2><table><tr>';
            foreach ($s['columns'] as $c) {
                $out .= '<th>' . self::html($c) . '</th>';
            }
            $out .= "</tr>\n";
            foreach ($s['rows'] as $row) {
                $out .= '<tr>';
                foreach ($row as $v) {
                    $out .= '<td>' . self::html($v) . '</td>';
                }
                $out .= "</tr>\n";
            }
            $out .= "</table>\n";
        }
        return $out . "</body></html>\n";
    }

    public static function html(string $s): string
    {
        return strtr($s, self::HTML);
    }

    /**
     * A value as the Go application shows it: what pgx's database/sql driver
     * returns for the type, through app.go's render (floats with two
     * decimals, times in UTC to the second, NULL empty).
     */
    public static function value(?string $v, int $type): string
    {
        if ($v === null) {
            return '';
        }
        switch ($type) {
            case self::FLOAT4:
                // pgx reads a real as a float32, widened to float64.
                return self::twoDecimals(self::float32(self::float($v)));
            case self::FLOAT8:
                return self::twoDecimals(self::float($v));
            case self::TIMESTAMP:
                // "2006-01-02 15:04:05" of the time: the fraction is dropped.
                return preg_match('/^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d/', $v) === 1 ? substr($v, 0, 19) : $v;
            case self::TIMESTAMPTZ:
                try {
                    return (new \DateTimeImmutable($v))->setTimezone(new \DateTimeZone('UTC'))->format('Y-m-d H:i:s');
                } catch (\Exception) {
                    return $v;
                }
            case self::DATE:
                return preg_match('/^\d{4}-\d\d-\d\d$/', $v) === 1 ? $v . ' 00:00:00' : $v;
            case self::BOOL:
                return $v === 't' ? 'true' : ($v === 'f' ? 'false' : $v);
            case self::BYTEA:
                return pg_unescape_bytea($v);
        }
        return $v;
    }

    /** Go's strconv.FormatFloat(f, 'f', 2, 64). */
    public static function twoDecimals(float $f): string
    {
        if (is_nan($f)) {
            return 'NaN';
        }
        if (is_infinite($f)) {
            return $f > 0 ? '+Inf' : '-Inf';
        }
        // Both round the exact binary value half to even; Go keeps the
        // sign of a negative zero, PHP's sprintf does not.
        if ($f === 0.0 && fdiv(1, $f) < 0) {
            return '-0.00';
        }
        return sprintf('%.2f', $f);
    }

    /** The float32 nearest to $f, as a PHP float. */
    public static function float32(float $f): float
    {
        return unpack('f', pack('f', $f))[1];
    }

    /** A float's PostgreSQL text form as a PHP float. */
    public static function float(string $v): float
    {
        return match ($v) {
            'NaN' => NAN,
            'Infinity' => INF,
            '-Infinity' => -INF,
            default => (float) $v,
        };
    }

    /** Go's strconv.Quote (%q), for the messages of bad parameters. */
    public static function goQuote(string $s): string
    {
        $out = '"';
        $n = strlen($s);
        for ($i = 0; $i < $n;) {
            $c = ord($s[$i]);
            if ($c < 0x80) {
                $out .= match (true) {
                    $s[$i] === '"' => '\\"',
                    $s[$i] === '\\' => '\\\\',
                    $c >= 0x20 && $c < 0x7f => $s[$i],
                    $c === 7 => '\\a', $c === 8 => '\\b', $c === 12 => '\\f', $c === 10 => '\\n',
                    $c === 13 => '\\r', $c === 9 => '\\t', $c === 11 => '\\v',
                    default => sprintf('\\x%02x', $c),
                };
                $i++;
                continue;
            }
            $len = $c >= 0xf0 ? 4 : ($c >= 0xe0 ? 3 : 2);
            $ch = substr($s, $i, $len);
            if ($c < 0xc2 || $c > 0xf4 || strlen($ch) < $len || preg_match('//u', $ch) !== 1) {
                $out .= sprintf('\\x%02x', $c);
                $i++;
                continue;
            }
            if (preg_match('/^[\p{L}\p{M}\p{N}\p{P}\p{S}]$/u', $ch) === 1) {
                $out .= $ch;
            } else {
                $cp = self::codePoint($ch);
                $out .= $cp > 0xffff ? sprintf('\\U%08x', $cp) : sprintf('\\u%04x', $cp);
            }
            $i += $len;
        }
        return $out . '"';
    }

    /** The code point of one valid UTF-8 character (without mbstring). */
    private static function codePoint(string $ch): int
    {
        $b = array_values(unpack('C*', $ch));
        return match (count($b)) {
            2 => ($b[0] & 0x1f) << 6 | ($b[1] & 0x3f),
            3 => ($b[0] & 0x0f) << 12 | ($b[1] & 0x3f) << 6 | ($b[2] & 0x3f),
            default => ($b[0] & 0x07) << 18 | ($b[1] & 0x3f) << 12 | ($b[2] & 0x3f) << 6 | ($b[3] & 0x3f),
        };
    }
}
