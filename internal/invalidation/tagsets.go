package invalidation

import (
	"encoding/json"
	"fmt"
	"slices"
	"strings"
)

// TagSetsReply is the invalidator's answer on TagSetsSubject (JSON).
//
// Tables names every table whose changes it publishes, with the tag column
// sets it publishes keyed tags for ([] for a covered table without sets).
// A table absent is not covered: a client must not cache a result reading
// it, nor key a result on a set the invalidator does not publish.
//
// From gives, for a set registered at run time (see TagSetsRegisterSubject),
// its effective LSN E, by SetName: every commit with LSN > E is published
// under the set, commits up to E were not. A client may key a result on the
// set only when the result's snapshot is at or after E. A set without an
// entry in From was published before any snapshot the client can hold (the
// sets the invalidator started with).
type TagSetsReply struct {
	Tables map[string][][]string `json:"tables"`
	From   map[string]uint64     `json:"from,omitempty"`
}

// SetName names a tag column set: "schema.table(col,col)", the canonical
// form of a keyed tag without its values.
func SetName(table string, columns []string) string {
	return table + "(" + strings.Join(columns, ",") + ")"
}

// Marshal encodes the reply.
func (r *TagSetsReply) Marshal() []byte {
	c := *r
	if c.Tables == nil {
		c.Tables = map[string][][]string{}
	}
	b, _ := json.Marshal(&c) // cannot fail
	return b
}

// DecodeTagSetsReply decodes a reply; a reply without tables is corrupt.
func DecodeTagSetsReply(b []byte) (TagSetsReply, error) {
	var r TagSetsReply
	if err := json.Unmarshal(b, &r); err != nil {
		return r, fmt.Errorf("%w: tag sets reply: %v", ErrCorrupt, err)
	}
	if r.Tables == nil {
		return r, fmt.Errorf("%w: tag sets reply without tables", ErrCorrupt)
	}
	return r, nil
}

// TagSetsBucket is the JetStream KV bucket where the invalidator keeps the
// tag column sets registered at run time ("LARDER_TAGSETS" for "larder").
func TagSetsBucket(prefix string) string {
	return strings.TrimSuffix(StreamName(prefix), "_INVALIDATIONS") + "_TAGSETS"
}

// TagSetsRegisterSubject takes requests (JSON TagSetsRegistration) to
// publish more tag column sets, from the next commit on. The invalidator
// answers with a TagSetsRegistered.
func TagSetsRegisterSubject(prefix string) string { return prefix + ".config.tagsets.register" }

// Bounds on registrations: what one request may ask, and how many sets
// the invalidator keeps in all. Past them a request is refused.
const (
	MaxRegisterSets    = 256
	MaxSetColumns      = 8
	MaxRegisteredSets  = 4096
	maxNameLen         = 512
	maxRegistrationLen = 256 << 10
)

// TagSetsRegistration asks the invalidator to publish keyed tags for
// these tag column sets ("schema.table" → sets of column names, in the
// order the analyzer lists them).
type TagSetsRegistration struct {
	Sets map[string][][]string `json:"sets"`
}

// DecodeTagSetsRegistration decodes and checks a request: bounded, every
// set non-empty, no empty or repeated names.
func DecodeTagSetsRegistration(b []byte) (TagSetsRegistration, error) {
	var r TagSetsRegistration
	if len(b) > maxRegistrationLen {
		return r, fmt.Errorf("%w: registration of %d bytes (limit %d)", ErrCorrupt, len(b), maxRegistrationLen)
	}
	if err := json.Unmarshal(b, &r); err != nil {
		return r, fmt.Errorf("%w: registration: %v", ErrCorrupt, err)
	}
	n := 0
	for table, sets := range r.Sets {
		if table == "" || len(table) > maxNameLen || !strings.Contains(table, ".") {
			return r, fmt.Errorf("%w: registration: table %q is not schema-qualified", ErrCorrupt, table)
		}
		for _, set := range sets {
			n++
			if len(set) == 0 || len(set) > MaxSetColumns {
				return r, fmt.Errorf("%w: registration: a set of %s has %d columns (1 to %d)", ErrCorrupt, table, len(set), MaxSetColumns)
			}
			for i, c := range set {
				if c == "" || len(c) > maxNameLen {
					return r, fmt.Errorf("%w: registration: a column name of %s is empty or too long", ErrCorrupt, table)
				}
				if slices.Contains(set[:i], c) {
					return r, fmt.Errorf("%w: registration: column %s repeated in a set of %s", ErrCorrupt, c, table)
				}
			}
		}
	}
	if n == 0 {
		return r, fmt.Errorf("%w: registration names no set", ErrCorrupt)
	}
	if n > MaxRegisterSets {
		return r, fmt.Errorf("%w: registration of %d sets (limit %d)", ErrCorrupt, n, MaxRegisterSets)
	}
	return r, nil
}

// TagSetsRegistered is the answer to a registration. Effective is the
// LSN the sets took effect at (see TagSetsReply.From; 0 when every set was
// already published). Refused lists the sets not published, by SetName,
// with the reason (a table not covered, a column it lacks, the limit).
// Warnings are for the operator (a replica identity lacking the set's
// columns: each UPDATE or DELETE of the table then flushes it, and the
// ALTER TABLE that fixes it). Reply is the tag sets reply after the
// registration. Error, when set, means nothing was registered.
type TagSetsRegistered struct {
	Effective uint64            `json:"effective,omitempty"`
	Refused   map[string]string `json:"refused,omitempty"`
	Warnings  []string          `json:"warnings,omitempty"`
	Reply     *TagSetsReply     `json:"reply,omitempty"`
	Error     string            `json:"error,omitempty"`
}
