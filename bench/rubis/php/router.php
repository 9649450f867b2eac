<?php

// RUBiS in PHP, for PHP's built-in server:
//
//   RUBIS_PG='host=127.0.0.1 port=6432 dbname=rubis user=rubis' PHP_CLI_SERVER_WORKERS=8 \
//     php -q -S 127.0.0.1:8083 bench/rubis/php/router.php
//
// Configuration by environment: see Rubis\App::fromEnvironment (README.md).

declare(strict_types=1);

require __DIR__ . '/../../../client-lib/php/autoload.php';
require_once __DIR__ . '/src/HttpError.php';
require_once __DIR__ . '/src/Render.php';
require_once __DIR__ . '/src/Request.php';
require_once __DIR__ . '/src/Interactions.php';
require_once __DIR__ . '/src/App.php';

Rubis\App::fromEnvironment()->serve();
