// Package wire decodes the small binary formats Larder speaks (the
// invalidation stream, the cache-node protocol): varints, bytes and
// length-prefixed strings read from a buffer with the first error kept,
// and counts checked against the bytes left, so that a corrupt length can
// never make a decoder allocate more than its input.
package wire
