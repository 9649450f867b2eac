// Package protocol is the cache-node's request/response protocol: lean,
// versioned binary frames over TCP — lookup, put, stats — with size limits.
// A malformed frame gets an error answer and the connection is closed; the
// node never crashes on one (fuzzed: FuzzDecodeRequests).
//
// Frame: uint32 big-endian length of the rest, a version byte (1), an op
// byte, the body. Bodies use unsigned varints; byte strings are a varint
// length and the bytes; text is UTF-8.
//
//	lookup request   key, uvarint tmin, uvarint tmax, template[, uvarint wait (µs, > 0)]
//	lookup answer    byte result (0 hit, else the miss class); on a hit: byte open,
//	                 uvarint lo, uvarint hi, uvarint snapshot, value
//	put request      key, uvarint snapshot, uvarint n, n × (tag, table, byte all-columns,
//	                 uvarint m, m × read column (sorted)), template, value
//	put answer       empty
//	stats request    empty
//	stats answer     uvarint watermark, varint keys, versions, bytes, budget, evictions
//	error answer     op 0x7f, the message
//
// Limits (see Server): connections at once, an idle timeout between
// requests, a read timeout per frame (and TLS handshake), a write timeout
// per answer, the frame size, and the request bytes in flight across
// connections; frame buffers grow as bytes arrive. Server.Collector
// exports what the server counts.
//
// Transport: plain TCP with Nagle off, one request at a time per
// connection, a pool of connections per client. A libp2p stream (the DHT's
// transport) adds a security handshake and a multiplexer to every
// connection and a framing layer to every request; the lookup latency goal
// (within 1.5× of a Redis GET) leaves no room for that, so libp2p will place
// keys and TCP will carry them.
package protocol
