package tags

import (
	"strings"
)

// Tag names what a cached result depends on and what a write changes.
type Tag struct {
	// Table is the schema-qualified table name, unquoted: "public.items".
	Table string
	// Columns is the tag column set in its fixed order; empty for the table tag.
	Columns []string
	// Values holds one canonical text value per column.
	Values []string
}

// TableTag returns the table tag of table ("schema.table").
func TableTag(table string) Tag { return Tag{Table: table} }

// IsTable reports whether t is a table tag.
func (t Tag) IsTable() bool { return len(t.Columns) == 0 }

// String returns the canonical name of t.
func (t Tag) String() string {
	var b strings.Builder
	b.Grow(len(t.Table) + 16*len(t.Columns))
	writeQualified(&b, t.Table)
	if len(t.Columns) == 0 {
		return b.String()
	}
	b.WriteByte('(')
	for i, c := range t.Columns {
		if i > 0 {
			b.WriteByte(',')
		}
		writeIdent(&b, c)
	}
	b.WriteString(")=")
	if len(t.Values) > 1 {
		b.WriteByte('(')
	}
	for i, v := range t.Values {
		if i > 0 {
			b.WriteByte(',')
		}
		writeValue(&b, v)
	}
	if len(t.Values) > 1 {
		b.WriteByte(')')
	}
	return b.String()
}

// ColumnSetName names a tag column set of a table: "public.items(id)".
func ColumnSetName(table string, columns []string) string {
	var b strings.Builder
	writeQualified(&b, table)
	b.WriteByte('(')
	for i, c := range columns {
		if i > 0 {
			b.WriteByte(',')
		}
		writeIdent(&b, c)
	}
	b.WriteByte(')')
	return b.String()
}

func writeQualified(b *strings.Builder, table string) {
	schema, rel, ok := strings.Cut(table, ".")
	if !ok {
		writeIdent(b, table)
		return
	}
	writeIdent(b, schema)
	b.WriteByte('.')
	writeIdent(b, rel)
}

// writeIdent writes an identifier as PostgreSQL's quote_ident would.
func writeIdent(b *strings.Builder, id string) {
	if plainIdent(id) {
		b.WriteString(id)
		return
	}
	b.WriteByte('"')
	b.WriteString(strings.ReplaceAll(id, `"`, `""`))
	b.WriteByte('"')
}

func plainIdent(id string) bool {
	if id == "" {
		return false
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		switch {
		case c >= 'a' && c <= 'z', c == '_':
		case (c >= '0' && c <= '9') || c == '$':
			if i == 0 {
				return false
			}
		default:
			return false
		}
	}
	return true
}

func writeValue(b *strings.Builder, v string) {
	if bareValue(v) {
		b.WriteString(v)
		return
	}
	b.WriteByte('\'')
	b.WriteString(strings.ReplaceAll(v, "'", "''"))
	b.WriteByte('\'')
}

func bareValue(v string) bool {
	if v == "" {
		return false
	}
	for i := 0; i < len(v); i++ {
		c := v[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_' || c == '.' || c == '-') {
			return false
		}
	}
	return true
}
