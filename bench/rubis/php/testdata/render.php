<?php

// Reads cases as JSON on standard input and writes what the PHP
// application makes of them (php_test.go compares with Go's answers).

declare(strict_types=1);

require_once __DIR__ . '/../src/HttpError.php';
require_once __DIR__ . '/../src/Render.php';
require_once __DIR__ . '/../src/Request.php';

use Rubis\Render;
use Rubis\Request;

$in = json_decode((string) file_get_contents('php://stdin'), true, 512, JSON_THROW_ON_ERROR);
$out = ['values' => [], 'quote' => [], 'atoi' => [], 'float' => [], 'html' => [], 'form' => []];
foreach ($in['values'] as [$text, $oid]) {
    $out['values'][] = Render::value($text, $oid);
}
foreach ($in['quote'] as $s) {
    $out['quote'][] = Render::goQuote(base64_decode($s));
}
foreach ($in['atoi'] as $s) {
    $out['atoi'][] = Request::atoi($s);
}
foreach ($in['float'] as $s) {
    $f = Request::parseFloat($s);
    $out['float'][] = $f === null ? null : Render::twoDecimals($f);
}
foreach ($in['html'] as $s) {
    $out['html'][] = base64_encode(Render::html(base64_decode($s)));
}
foreach ($in['form'] as [$query, $body, $name]) {
    $out['form'][] = (new Request('X', $query, 'application/x-www-form-urlencoded', $body))->form($name);
}
echo json_encode($out, JSON_THROW_ON_ERROR | JSON_PRESERVE_ZERO_FRACTION);
