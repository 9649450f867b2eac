// Package php runs RUBiS's PHP application (router.php, src/): the 27
// interactions of package app on the Larder PHP library
// (client-lib/php), served by PHP's built-in server with several
// workers, on PostgreSQL (direct) or through a Larder front. Start runs
// it; rubis-bench's php-direct and php-larder modes and this package's
// tests use it. The tests compare its pages with the Go application's,
// byte for byte, and run the PHP library's PHPUnit suite.
//
// # Concurrency
//
// A Server is safe for concurrent use; Close is idempotent.
package php
