package invalidation

// Pin messages: what the pincushion says about its pinned snapshots.
//
// Subjects (with prefix p):
//
//	p.pins.announce   every new pin, published once (payload: pin)
//	p.pins.release    every pin released (expired, thinned, or replaced by a
//	                  newer one at the same LSN), published once (payload: pin)
//	p.pins.list       request with any payload; reply: pin list of the pins held now
//	p.pins.verify     request: verify request; reply: verify reply
//	p.pins.horizon    from each client every few seconds (payload: staleness
//	                  demand, no reply): the largest staleness limit it used
//
// Every message starts with two bytes: the pin format version (1 or 2)
// and the kind. Integers are unsigned LEB128 varints ("uvarint") unless
// said otherwise; a time is a signed zigzag varint of Unix nanoseconds,
// 0 meaning unset; a string is a uvarint byte length and the bytes (valid
// UTF-8). Nothing may follow the body.
//
//	kind 0x10 pin             pin-body
//	kind 0x11 pin list        uvarint n (<= 4096), then n pin-bodies, oldest first
//	kind 0x12 verify request  uvarint xmin, uvarint xmax, uvarint n, n uvarint
//	                          in-progress xids (strictly ascending, in [xmin, xmax)),
//	                          uvarint insert LSN (non-zero)
//	kind 0x13 verify reply    byte ok (0 or 1), uvarint timestamp (0 unless ok),
//	                          string reason (empty if ok, <= 1024 bytes)
//	kind 0x14 staleness demand uvarint staleness limit in milliseconds
//	                          (1..PinMaxDemandMillis)
//
//	pin-body                  uvarint LSN, time taken-at, time expires-at,
//	                          string snapshot id (1..64 bytes of [0-9A-Za-z_-]),
//	                          time server-start (version 2 only)
//
// Xids are 64-bit full transaction ids, as pg_current_snapshot() prints
// them. The insert LSN is pg_current_wal_insert_lsn() read after the
// snapshot was taken. A message is at most 1 MiB.
//
// Version 2 adds the server start to the pin-body: the
// pg_postmaster_start_time() of the PostgreSQL server that exported the
// snapshot, read in the same statement. Exported snapshot ids are unique
// only within one run of the server (backend id, local xid, counter): after
// a restart a new snapshot can get the id of an old one, and a client must
// import a pin only on a connection to the server run that exported it. A
// version 1 pin-body has no server start (decoded as unset: unknown).
// Decoders read both versions of every kind. Pins and pin lists are written
// in version 2; verify requests and replies, whose bodies are the same in
// both versions, are written in version 1, which either build reads.

import (
	"encoding/binary"
	"fmt"
	"time"
	"unicode/utf8"
)

// PinVersion is the pin format version this package writes pins and pin
// lists in; it reads it and every earlier version (down to 1).
const PinVersion = 2

// pinVersionVerify is the version verify requests and replies are written
// in: their bodies did not change in version 2, and a pincushion or client
// of version 1 reads them.
const pinVersionVerify = 1

// Pin message kinds (the second byte).
const (
	pinKindPin           = 0x10
	pinKindList          = 0x11
	pinKindVerifyRequest = 0x12
	pinKindVerifyReply   = 0x13
	pinKindDemand        = 0x14
)

// Limits of the pin format.
const (
	PinMaxSnapshotID = 64
	PinMaxList       = 4096
	PinMaxReason     = 1024
	PinMaxMessage    = 1 << 20
	// PinMaxDemandMillis bounds a staleness demand: one day.
	PinMaxDemandMillis = 24 * 3600 * 1000
)

// Pin is a pinned snapshot: a client imports it with
// SET TRANSACTION SNAPSHOT 'SnapshotID' and sees exactly the transactions
// whose commit LSN is <= LSN. TakenAt is when the snapshot was current;
// the pincushion keeps it until ExpiresAt at the latest.
//
// ServerStart is the pg_postmaster_start_time() of the PostgreSQL server
// that exported the snapshot (zero: unknown, a version 1 pin). Snapshot ids
// repeat across server restarts: a pin must not be imported on a
// connection to a server that started at another time, where its id may
// name another snapshot.
type Pin struct {
	SnapshotID  string
	LSN         uint64
	TakenAt     time.Time
	ExpiresAt   time.Time
	ServerStart time.Time
}

// Same reports whether q is the pin p: the same exported snapshot of the
// same server run, at the same LSN (the times it was taken and expires
// are not compared).
func (p Pin) Same(q Pin) bool {
	return p.SnapshotID == q.SnapshotID && p.LSN == q.LSN && p.ServerStart.Equal(q.ServerStart)
}

// OtherServer reports whether the pin was exported by another run of the
// PostgreSQL server than the one that started at serverStart: both are
// known and differ. A pin whose server start is unknown is not.
func (p Pin) OtherServer(serverStart time.Time) bool {
	return !p.ServerStart.IsZero() && !serverStart.IsZero() && !p.ServerStart.Equal(serverStart)
}

// PinVerifyRequest asks the pincushion to verify a snapshot a client took
// itself: the snapshot as pg_current_snapshot() gives it and
// pg_current_wal_insert_lsn() read after it, in the same statement.
type PinVerifyRequest struct {
	Xmin, Xmax uint64
	Xip        []uint64
	InsertLSN  uint64
}

// PinVerifyReply answers a PinVerifyRequest: OK with the snapshot's
// timestamp TS when it is exact, else the Reason it is not (or could not
// be shown to be).
type PinVerifyReply struct {
	TS     uint64
	OK     bool
	Reason string
}

// PinAnnounceSubject is the subject new pins are announced on.
func PinAnnounceSubject(prefix string) string { return prefix + ".pins.announce" }

// PinReleaseSubject is the subject released pins are announced on: a
// client forgets them rather than keep every pin ever announced.
func PinReleaseSubject(prefix string) string { return prefix + ".pins.release" }

// PinListSubject is the subject to request the current pins on.
func PinListSubject(prefix string) string { return prefix + ".pins.list" }

// PinVerifySubject is the subject to request a snapshot's verification on.
func PinVerifySubject(prefix string) string { return prefix + ".pins.verify" }

// PinDemandInterval is how often a client announces its staleness demand
// on PinHorizonSubject.
const PinDemandInterval = 5 * time.Second

// PinHorizonSubject is the subject clients announce their staleness
// demand on: the pincushion keeps pins no longer than the largest limit
// announced recently (a pin older than every client's limit is of use to
// no transaction, and holds back PostgreSQL's cleanup of old row
// versions).
func PinHorizonSubject(prefix string) string { return prefix + ".pins.horizon" }

// PinValidSnapshotID reports whether id can be a pin's snapshot id (what
// pg_export_snapshot returns, e.g. "00000003-0000001B-1"). The check also
// makes the id safe to quote into SET TRANSACTION SNAPSHOT.
func PinValidSnapshotID(id string) error {
	if id == "" || len(id) > PinMaxSnapshotID {
		return fmt.Errorf("snapshot id of %d bytes, want 1 to %d", len(id), PinMaxSnapshotID)
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		if !('0' <= c && c <= '9' || 'A' <= c && c <= 'Z' || 'a' <= c && c <= 'z' || c == '-' || c == '_') {
			return fmt.Errorf("snapshot id %q has byte %#x at %d", id, c, i)
		}
	}
	return nil
}

func pinHeader(version, kind byte) []byte { return []byte{version, kind} }

func pinAppendTime(dst []byte, t time.Time) []byte {
	if t.IsZero() {
		return binary.AppendVarint(dst, 0)
	}
	return binary.AppendVarint(dst, t.UnixNano())
}

func pinAppendString(dst []byte, s string) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(s)))
	return append(dst, s...)
}

func pinAppendBody(dst []byte, p Pin) []byte {
	dst = binary.AppendUvarint(dst, p.LSN)
	dst = pinAppendTime(dst, p.TakenAt)
	dst = pinAppendTime(dst, p.ExpiresAt)
	dst = pinAppendString(dst, p.SnapshotID)
	return pinAppendTime(dst, p.ServerStart)
}

// EncodePin encodes a pin announcement.
func EncodePin(p Pin) []byte { return pinAppendBody(pinHeader(PinVersion, pinKindPin), p) }

// EncodePinList encodes a list of pins (oldest first).
func EncodePinList(pins []Pin) []byte {
	b := binary.AppendUvarint(pinHeader(PinVersion, pinKindList), uint64(len(pins)))
	for _, p := range pins {
		b = pinAppendBody(b, p)
	}
	return b
}

// EncodePinVerifyRequest encodes a verify request.
func EncodePinVerifyRequest(r PinVerifyRequest) []byte {
	b := pinHeader(pinVersionVerify, pinKindVerifyRequest)
	b = binary.AppendUvarint(b, r.Xmin)
	b = binary.AppendUvarint(b, r.Xmax)
	b = binary.AppendUvarint(b, uint64(len(r.Xip)))
	for _, x := range r.Xip {
		b = binary.AppendUvarint(b, x)
	}
	return binary.AppendUvarint(b, r.InsertLSN)
}

// EncodePinVerifyReply encodes a verify reply.
func EncodePinVerifyReply(r PinVerifyReply) []byte {
	b := pinHeader(pinVersionVerify, pinKindVerifyReply)
	if r.OK {
		b = append(b, 1)
	} else {
		b = append(b, 0)
	}
	b = binary.AppendUvarint(b, r.TS)
	return pinAppendString(b, r.Reason)
}

// EncodeStalenessDemand encodes a client's staleness demand: the largest
// staleness limit its read-only transactions used lately, in whole
// milliseconds rounded up, between 1 ms and PinMaxDemandMillis.
func EncodeStalenessDemand(d time.Duration) []byte {
	ms := (d + time.Millisecond - 1) / time.Millisecond
	ms = min(max(ms, 1), PinMaxDemandMillis)
	return binary.AppendUvarint(pinHeader(pinVersionVerify, pinKindDemand), uint64(ms))
}

// DecodeStalenessDemand decodes a staleness demand.
func DecodeStalenessDemand(b []byte) (time.Duration, error) {
	r, err := pinOpen(b, pinKindDemand, "staleness demand")
	if err != nil {
		return 0, err
	}
	ms := r.uvarint("staleness")
	if r.err == nil && (ms == 0 || ms > PinMaxDemandMillis) {
		r.fail("staleness of %d ms, want 1 to %d", ms, PinMaxDemandMillis)
	}
	if err := r.finish(); err != nil {
		return 0, err
	}
	return time.Duration(ms) * time.Millisecond, nil
}

// DecodePin decodes a pin announcement.
func DecodePin(b []byte) (Pin, error) {
	r, err := pinOpen(b, pinKindPin, "pin")
	if err != nil {
		return Pin{}, err
	}
	p := r.body()
	return p, r.finish()
}

// DecodePinList decodes a list of pins.
func DecodePinList(b []byte) ([]Pin, error) {
	r, err := pinOpen(b, pinKindList, "pin list")
	if err != nil {
		return nil, err
	}
	n := r.count("pin count", PinMaxList, 4)
	pins := make([]Pin, 0, n)
	for i := 0; i < n && r.err == nil; i++ {
		pins = append(pins, r.body())
	}
	if err := r.finish(); err != nil {
		return nil, err
	}
	return pins, nil
}

// DecodePinVerifyRequest decodes a verify request.
func DecodePinVerifyRequest(b []byte) (PinVerifyRequest, error) {
	r, err := pinOpen(b, pinKindVerifyRequest, "pin verify request")
	if err != nil {
		return PinVerifyRequest{}, err
	}
	var q PinVerifyRequest
	q.Xmin = r.uvarint("xmin")
	q.Xmax = r.uvarint("xmax")
	if r.err == nil && q.Xmin > q.Xmax {
		r.fail("xmin %d is past xmax %d", q.Xmin, q.Xmax)
	}
	n := r.count("in-progress xid count", PinMaxMessage, 1)
	if n > 0 {
		q.Xip = make([]uint64, 0, n)
	}
	for i := 0; i < n && r.err == nil; i++ {
		x := r.uvarint("in-progress xid")
		switch {
		case r.err != nil:
		case x < q.Xmin || x >= q.Xmax:
			r.fail("in-progress xid %d is outside [xmin %d, xmax %d)", x, q.Xmin, q.Xmax)
		case i > 0 && x <= q.Xip[i-1]:
			r.fail("in-progress xid %d does not follow %d", x, q.Xip[i-1])
		}
		q.Xip = append(q.Xip, x)
	}
	q.InsertLSN = r.uvarint("insert LSN")
	if r.err == nil && q.InsertLSN == 0 {
		r.fail("insert LSN is 0")
	}
	if err := r.finish(); err != nil {
		return PinVerifyRequest{}, err
	}
	return q, nil
}

// DecodePinVerifyReply decodes a verify reply.
func DecodePinVerifyReply(b []byte) (PinVerifyReply, error) {
	r, err := pinOpen(b, pinKindVerifyReply, "pin verify reply")
	if err != nil {
		return PinVerifyReply{}, err
	}
	var p PinVerifyReply
	switch ok := r.byte("ok flag"); {
	case r.err != nil:
	case ok > 1:
		r.fail("ok flag %d", ok)
	default:
		p.OK = ok == 1
	}
	p.TS = r.uvarint("timestamp")
	p.Reason = r.string("reason", PinMaxReason)
	if r.err == nil && p.OK && p.Reason != "" {
		r.fail("an ok reply carries a reason")
	}
	if r.err == nil && !p.OK && p.TS != 0 {
		r.fail("a refusal carries timestamp %d", p.TS)
	}
	if err := r.finish(); err != nil {
		return PinVerifyReply{}, err
	}
	return p, nil
}

// pinReader decodes a message body; the first error sticks.
type pinReader struct {
	what    string
	version byte
	b       []byte
	err     error
}

func pinOpen(b []byte, kind byte, what string) (*pinReader, error) {
	if len(b) < 2 {
		return nil, fmt.Errorf("%w: %s of %d bytes", ErrCorrupt, what, len(b))
	}
	if len(b) > PinMaxMessage {
		return nil, fmt.Errorf("%w: %s of %d bytes is over the %d limit", ErrCorrupt, what, len(b), PinMaxMessage)
	}
	if b[0] < 1 || b[0] > PinVersion {
		return nil, fmt.Errorf("%w: %s has pin format version %d (this build reads 1 to %d)", ErrVersion, what, b[0], PinVersion)
	}
	if b[1] != kind {
		return nil, fmt.Errorf("%w: kind %#x where a %s (%#x) was expected", ErrKind, b[1], what, kind)
	}
	return &pinReader{what: what, version: b[0], b: b[2:]}, nil
}

func (r *pinReader) fail(format string, args ...any) {
	if r.err == nil {
		r.err = fmt.Errorf("%w: %s: %s", ErrCorrupt, r.what, fmt.Sprintf(format, args...))
	}
}

func (r *pinReader) finish() error {
	if r.err == nil && len(r.b) > 0 {
		r.fail("%d bytes after the end", len(r.b))
	}
	return r.err
}

func (r *pinReader) uvarint(field string) uint64 {
	if r.err != nil {
		return 0
	}
	v, n := binary.Uvarint(r.b)
	if n <= 0 {
		r.fail("%s: truncated or overlong varint", field)
		return 0
	}
	r.b = r.b[n:]
	return v
}

func (r *pinReader) varint(field string) int64 {
	if r.err != nil {
		return 0
	}
	v, n := binary.Varint(r.b)
	if n <= 0 {
		r.fail("%s: truncated or overlong varint", field)
		return 0
	}
	r.b = r.b[n:]
	return v
}

func (r *pinReader) byte(field string) byte {
	if r.err != nil {
		return 0
	}
	if len(r.b) == 0 {
		r.fail("%s: truncated", field)
		return 0
	}
	c := r.b[0]
	r.b = r.b[1:]
	return c
}

// count reads a count of items of at least minSize bytes each, refusing
// one above limit or above what the remaining bytes can hold.
func (r *pinReader) count(field string, limit, minSize int) int {
	v := r.uvarint(field)
	if r.err != nil {
		return 0
	}
	if v > uint64(limit) || v > uint64(len(r.b)/minSize) {
		r.fail("%s %d is more than the message can hold", field, v)
		return 0
	}
	return int(v)
}

func (r *pinReader) string(field string, limit int) string {
	n := r.uvarint(field + " length")
	if r.err != nil {
		return ""
	}
	if n > uint64(limit) || n > uint64(len(r.b)) {
		r.fail("%s of %d bytes (limit %d, %d left)", field, n, limit, len(r.b))
		return ""
	}
	s := string(r.b[:n])
	r.b = r.b[n:]
	if !utf8.ValidString(s) {
		r.fail("%s is not UTF-8", field)
		return ""
	}
	return s
}

func (r *pinReader) time(field string) time.Time {
	ns := r.varint(field)
	if r.err != nil || ns == 0 {
		return time.Time{}
	}
	return time.Unix(0, ns).UTC()
}

func (r *pinReader) body() Pin {
	var p Pin
	p.LSN = r.uvarint("LSN")
	p.TakenAt = r.time("taken-at")
	p.ExpiresAt = r.time("expires-at")
	p.SnapshotID = r.string("snapshot id", PinMaxSnapshotID)
	if r.err == nil {
		if err := PinValidSnapshotID(p.SnapshotID); err != nil {
			r.fail("%v", err)
		}
	}
	if r.version >= 2 {
		p.ServerStart = r.time("server start")
	}
	return p
}
