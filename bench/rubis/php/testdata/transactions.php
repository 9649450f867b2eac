<?php

// Times Client::readOnly transactions of the item page's four reads, for
// php_test.go's BenchmarkReadOnlyTransaction:
//   php transactions.php DSN direct(0|1) reconnect(0|1) COUNT
// reconnect 1 takes the persistent connection with pg_pconnect before each
// transaction, as each request of a PHP server does. Prints microseconds
// per transaction.

declare(strict_types=1);

require __DIR__ . '/../../../../client-lib/php/autoload.php';

use Larder\Client;

[, $dsn, $direct, $reconnect, $count] = $argv;
$options = ['direct' => $direct === '1', 'persistent' => true];
$read = static function (Client $tx): void {
    $tx->query('SELECT * FROM items WHERE id = $1', [5]);
    $tx->query('SELECT MAX(bid) FROM bids WHERE item_id = $1', [5]);
    $tx->query('SELECT COUNT(*) FROM bids WHERE item_id = $1', [5]);
    $tx->query('SELECT nickname FROM users WHERE id = $1', [7]);
};
$db = new Client($dsn, $options);
for ($i = 0; $i < 20; $i++) {
    $db->readOnly(30, $read); // prepared, cached
}
$n = (int) $count;
$start = hrtime(true);
for ($i = 0; $i < $n; $i++) {
    if ($reconnect === '1') {
        $db = new Client($dsn, $options);
    }
    $db->readOnly(30, $read);
}
printf("%.1f\n", (hrtime(true) - $start) / 1e3 / $n);
