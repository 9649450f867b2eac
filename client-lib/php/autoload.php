<?php

// A PSR-4 autoloader for the Larder\ namespace (src/), for use without
// Composer: require this file once. With Composer, composer.json's
// "autoload" section does the same.

declare(strict_types=1);

spl_autoload_register(static function (string $class): void {
    $prefix = 'Larder\\';
    if (strncmp($class, $prefix, strlen($prefix)) !== 0) {
        return;
    }
    $file = __DIR__ . '/src/' . str_replace('\\', '/', substr($class, strlen($prefix))) . '.php';
    if (is_file($file)) {
        require $file;
    }
});
