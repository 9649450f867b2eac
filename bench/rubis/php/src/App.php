<?php

declare(strict_types=1);

namespace Rubis;

use Larder\Client;

/**
 * RUBiS, the auction site, in PHP on the Larder library: the 27
 * interactions of bench/rubis/app, at the same URLs with the same
 * parameters, rendering the same pages. Browsing pages run in read-only
 * transactions (Client::readOnly, which the front answers from Larder's
 * caches), writes in read/write ones.
 */
final class App
{
    use Interactions;

    /** The 27 emulator states, by path, in the order of app.Interactions. */
    public const INTERACTIONS = [
        'Home', 'Register', 'RegisterUser', 'Browse', 'BrowseCategories', 'SearchItemsInCategory',
        'BrowseRegions', 'BrowseCategoriesInRegion', 'SearchItemsInRegion', 'ViewItem', 'ViewUserInfo',
        'ViewBidHistory', 'BuyNowAuth', 'BuyNow', 'StoreBuyNow', 'PutBidAuth', 'PutBid', 'StoreBid',
        'PutCommentAuth', 'PutComment', 'StoreComment', 'Sell', 'SelectCategoryToSellItem', 'SellItemForm',
        'RegisterItem', 'AboutMeAuth', 'AboutMe',
    ];

    /** The pages without data, and their message. */
    private const STATIC = [
        'Home' => 'Welcome to RUBiS', 'Register' => 'Register', 'Browse' => 'Browse',
        'BuyNowAuth' => 'Buy now: log in', 'PutBidAuth' => 'Bid: log in', 'PutCommentAuth' => 'Comment: log in',
        'Sell' => 'Sell', 'SellItemForm' => 'Sell an item', 'AboutMeAuth' => 'About me: log in',
    ];

    /** Seconds between the zero time of Go's time.Truncate and the Unix epoch. */
    private const GO_ZERO_TIME = 62135596800;

    private Client $db;

    /** @var float the staleness limit of read-only pages, in seconds */
    private float $staleness;

    /** @var int the rounding of $now in time-dependent reads, in seconds */
    private int $granularity;

    private bool $sqlNow;

    /** @var float|null a fixed clock (Unix seconds), or null for the real one */
    private ?float $clock;

    public function __construct(Client $db, float $staleness = 30.0, int $granularity = 60, bool $sqlNow = false, ?float $clock = null)
    {
        if ($granularity < 1) {
            throw new \InvalidArgumentException('rubis: the now granularity must be at least a second');
        }
        $this->db = $db;
        $this->staleness = $staleness;
        $this->granularity = $granularity;
        $this->sqlNow = $sqlNow;
        $this->clock = $clock;
    }

    /**
     * The application configured by the environment:
     *   RUBIS_PG               the database: the front's address (or PostgreSQL's, direct), a libpq
     *                          connection string or postgresql:// URI (required)
     *   RUBIS_MODE             larder (through the front, the default) or direct (plain PostgreSQL)
     *   RUBIS_STALENESS        staleness limit of read-only pages, seconds (30)
     *   RUBIS_NOW_GRANULARITY  rounding of $now in time-dependent reads, seconds (60)
     *   RUBIS_SQL_NOW          1: RUBiS's original end_date >= now() instead of $now
     *   RUBIS_PERSISTENT       0: a connection per request instead of one per worker (1)
     *   RUBIS_CLOCK            a fixed clock, Unix seconds (tests)
     */
    public static function fromEnvironment(): self
    {
        $dsn = (string) getenv('RUBIS_PG');
        if ($dsn === '') {
            throw new \RuntimeException('rubis: RUBIS_PG (the front\'s or PostgreSQL\'s address) is not set');
        }
        $mode = getenv('RUBIS_MODE') ?: 'larder';
        if ($mode !== 'larder' && $mode !== 'direct') {
            throw new \RuntimeException("rubis: RUBIS_MODE=$mode: want larder or direct");
        }
        $clock = getenv('RUBIS_CLOCK');
        $db = new Client($dsn, ['direct' => $mode === 'direct', 'persistent' => getenv('RUBIS_PERSISTENT') !== '0']);
        return new self($db, (float) (getenv('RUBIS_STALENESS') ?: 30), (int) (getenv('RUBIS_NOW_GRANULARITY') ?: 60),
            getenv('RUBIS_SQL_NOW') === '1', $clock === false || $clock === '' ? null : (float) $clock);
    }

    /**
     * Serves one request and returns its status, headers and body, as the
     * Go application's handler (net/http's ServeMux, app.serve) answers.
     *
     * @return array{int, array<string, string>, string}
     */
    public function handle(string $path, string $query, string $contentType = '', string $body = ''): array
    {
        $name = substr($path, 1);
        if ($path === '' || $path[0] !== '/' || !in_array($name, self::INTERACTIONS, true)) {
            return [404, ['Content-Type' => 'text/plain; charset=utf-8', 'X-Content-Type-Options' => 'nosniff'], "404 page not found\n"];
        }
        $q = new Request($name, $query, $contentType, $body);
        try {
            if (isset(self::STATIC[$name])) {
                $q->message = self::STATIC[$name];
            } else {
                $this->{lcfirst($name)}($q);
            }
        } catch (\Throwable $e) {
            $status = $e instanceof HttpError ? $e->status : 500;
            if ($status >= 500) {
                error_log(sprintf('rubis: interaction failed: interaction=%s err=%s', $name, $e->getMessage()));
            }
            return [$status, ['Content-Type' => 'text/plain; charset=utf-8', 'X-Content-Type-Options' => 'nosniff'],
                $name . ': ' . $e->getMessage() . "\n"];
        }
        return [200, ['Content-Type' => 'text/html; charset=utf-8'], Render::page($q->title, $q->message, $q->sections)];
    }

    /** Serves the request PHP's server is handling. */
    public function serve(): void
    {
        $uri = $_SERVER['REQUEST_URI'] ?? '/';
        $path = rawurldecode((string) parse_url($uri, PHP_URL_PATH));
        $query = (string) ($_SERVER['QUERY_STRING'] ?? '');
        $contentType = (string) ($_SERVER['CONTENT_TYPE'] ?? '');
        $body = ($_SERVER['REQUEST_METHOD'] ?? 'GET') === 'GET' ? '' : (string) file_get_contents('php://input');
        [$status, $headers, $out] = $this->handle($path, $query, $contentType, $body);
        http_response_code($status);
        foreach ($headers as $k => $v) {
            header("$k: $v");
        }
        echo $out;
    }

    /** The clock, Unix seconds. */
    private function time(): float
    {
        return $this->clock ?? microtime(true);
    }

    /** $now: the clock rounded down to the granularity (Go's time.Truncate). */
    private function now(): int
    {
        $abs = (int) floor($this->time()) + self::GO_ZERO_TIME;
        return $abs - $abs % $this->granularity - self::GO_ZERO_TIME;
    }

    /** A time as a timestamp parameter, in UTC, to the microsecond. */
    private static function timestamp(float $t): string
    {
        $s = (int) floor($t);
        return gmdate('Y-m-d H:i:s', $s) . sprintf('.%06d', min(999999, (int) round(($t - $s) * 1e6)));
    }

    /**
     * "col >= $n" with $now appended to $args, or the original now() form.
     *
     * @param list<mixed> $args
     */
    private function endDateFilter(string $col, int $n, array &$args): string
    {
        if ($this->sqlNow) {
            return $col . ' >= now()';
        }
        $args[] = gmdate('Y-m-d H:i:s', $this->now());
        return sprintf('%s >= $%d', $col, $n);
    }

    /**
     * Runs $fn in a read-only transaction; when Larder asks for it to run
     * again, the attempt's sections and message are dropped.
     *
     * @param callable(Client): void $fn
     */
    private function read(Request $q, callable $fn): void
    {
        $sections = $q->sections;
        $message = $q->message;
        $this->db->readOnly($this->staleness, static function (Client $db) use ($q, $fn, $sections, $message): void {
            $q->sections = $sections;
            $q->message = $message;
            $fn($db);
        });
    }

    /**
     * Runs $fn in a read/write transaction.
     *
     * @param callable(Client): void $fn
     */
    private function write(callable $fn): void
    {
        $this->db->readWrite($fn);
    }

    /**
     * A section with the rows of a query, rendered as the Go application
     * renders them.
     *
     * @param list<mixed> $args
     * @return array{title: string, columns: list<string>, rows: list<list<string>>}
     */
    private static function query(Client $db, string $title, string $sql, array $args = []): array
    {
        $r = $db->query($sql, $args);
        $types = $r->types();
        $rows = [];
        foreach ($r->rows() as $row) {
            $out = [];
            foreach ($row as $i => $v) {
                $out[] = Render::value($v, $types[$i]);
            }
            $rows[] = $out;
        }
        return ['title' => $title, 'columns' => $r->fields(), 'rows' => $rows];
    }

    /**
     * The values of a column of a section.
     *
     * @param array{title: string, columns: list<string>, rows: list<list<string>>} $s
     * @return list<string>
     */
    private static function column(array $s, string $name): array
    {
        $i = array_search($name, $s['columns'], true);
        if ($i === false) {
            return [];
        }
        return array_map(static fn (array $row): string => $row[$i], $s['rows']);
    }

    /** The user id for the request's nickname and password, or a 401. */
    private static function auth(Request $q, Client $db): int
    {
        $id = $db->queryValue('SELECT id FROM users WHERE nickname = $1 AND password = $2', [$q->form('nickname'), $q->form('password')]);
        if ($id === null) {
            throw new HttpError(401, 'unknown nickname or wrong password');
        }
        return (int) $id;
    }

    private static function notFound(string $what): HttpError
    {
        return new HttpError(404, $what . ' not found');
    }

    /** Go's trim: the first $n bytes of a longer value, else the value without surrounding space. */
    private static function trim(string $s, int $n): string
    {
        if (strlen($s) > $n) {
            return substr($s, 0, $n);
        }
        return preg_replace('/^\s+|\s+$/u', '', $s) ?? trim($s);
    }
}
