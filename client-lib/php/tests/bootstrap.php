<?php

declare(strict_types=1);

require __DIR__ . '/../autoload.php';
require __DIR__ . '/TestCase.php';
