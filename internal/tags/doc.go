// Package tags defines invalidation tags and their canonical names, shared by
// every component: qumaana computes the tags a query result holds, the
// invalidator the tags a write publishes, and cache-nodes match the two.
//
// # Names
//
// A table tag is the schema-qualified table: public.items. A keyed tag adds a
// tag column set and one value per column, in PostgreSQL's text output form:
//
//	public.items(id)=42
//	public.bids(item_id,user_id)=(7,3)
//	public.users(nickname)='o''brien'
//
// Identifiers are double-quoted when PostgreSQL would need it. A value is
// written bare when it consists only of letters, digits and "_.-" (and is not
// empty), otherwise single-quoted with quotes doubled, so two different tags
// never share a name. Matching is exact equality of names.
//
// # Thread safety
//
// Tag values are immutable once built; functions are pure.
package tags
