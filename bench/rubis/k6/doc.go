// Package k6 holds the RUBiS load script (rubis.js) for k6 and the test
// that its transition walk reproduces the specification's mix. The script
// walks the same original tables as package mix.
package k6
