package invalidation

import (
	"encoding/json"
	"fmt"
)

// SchemaChangedSubject carries, on core NATS (not in JetStream), a notice
// after every transaction with a schema change the invalidator decoded:
// JSON SchemaChange. The flushes it caused travel on the tables' flush
// subjects as usual; the notice tells clients to re-read the catalog and
// the TagSetsSubject reply, which the invalidator has already updated.
func SchemaChangedSubject(prefix string) string { return prefix + ".schema.changed" }

// SchemaChange is the notice on SchemaChangedSubject.
type SchemaChange struct {
	// CommitLSN is the commit LSN of the transaction holding the change.
	CommitLSN uint64 `json:"commit_lsn"`
	// Flushed lists the tables flushed at CommitLSN ("schema.table").
	Flushed []string `json:"flushed"`
}

// Append appends the notice's JSON to b.
func (s *SchemaChange) Append(b []byte) []byte {
	c := *s
	if c.Flushed == nil {
		c.Flushed = []string{}
	}
	j, _ := json.Marshal(&c) // cannot fail
	return append(b, j...)
}

// DecodeSchemaChange decodes a notice.
func DecodeSchemaChange(b []byte) (SchemaChange, error) {
	var s SchemaChange
	if err := json.Unmarshal(b, &s); err != nil {
		return s, fmt.Errorf("%w: schema change notice: %v", ErrCorrupt, err)
	}
	if s.CommitLSN == 0 {
		return s, fmt.Errorf("%w: schema change notice without a commit LSN", ErrCorrupt)
	}
	return s, nil
}
