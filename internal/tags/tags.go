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

// derivedArrow separates a derived column's foreign key column from the
// column it names in the referenced table.
const derivedArrow = "->"

// DerivedColumn names a derived tag column: the value of refColumn in the row
// of refTable ("schema.table") whose single-column primary key equals the
// row's fkColumn. The tag column set (category, seller->public.users.region)
// of public.items groups items by category and by their seller's region.
func DerivedColumn(fkColumn, refTable, refColumn string) string {
	return fkColumn + derivedArrow + refTable + "." + refColumn
}

// ParseDerivedColumn splits a derived column's name (DerivedColumn); ok is
// false for a plain column.
func ParseDerivedColumn(name string) (fkColumn, refTable, refColumn string, ok bool) {
	fk, rest, found := strings.Cut(name, derivedArrow)
	if !found || fk == "" {
		return "", "", "", false
	}
	i := strings.LastIndexByte(rest, '.')
	if i <= 0 || i == len(rest)-1 || !strings.Contains(rest[:i], ".") {
		return "", "", "", false
	}
	return fk, rest[:i], rest[i+1:], true
}

// IsDerivedSet reports whether a tag column set holds a derived column.
func IsDerivedSet(columns []string) bool {
	for _, c := range columns {
		if _, _, _, ok := ParseDerivedColumn(c); ok {
			return true
		}
	}
	return false
}

// SetTag is the tag of a whole derived tag column set: a result keyed on a
// derived set also holds it, and the invalidator publishes it (as a change of
// rows) for every change to the set's tables while it cannot compute the
// set's keyed tags exactly (its index of the referenced table is loading).
// Its name is the set's name followed by "=" and no value, which no keyed tag
// has.
func SetTag(table string, columns []string) Tag {
	return Tag{Table: table, Columns: columns}
}
