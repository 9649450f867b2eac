package publisher

import (
	"context"
	"strings"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/larderdb/larder/internal/invalidation"
	"github.com/larderdb/larder/internal/tags"
)

const derivedDDL = `
CREATE TABLE users (id int PRIMARY KEY, nickname text, region int);
CREATE TABLE items (id int PRIMARY KEY, category int, seller int, name text, max_bid int, seller_nick text);
ALTER TABLE items REPLICA IDENTITY FULL;
INSERT INTO users VALUES (1, 'ann', 1), (2, 'bob', 2);
INSERT INTO items VALUES (10, 5, 1, 'pen', 0);
`

var regionSet = []string{"category", tags.DerivedColumn("seller", "public.users", "region")}

func derivedSets() map[string][][]string {
	return map[string][][]string{
		"public.items": {{"id"}, regionSet},
		"public.users": {{"id"}},
	}
}

// derivedTag names the region set's keyed tag for (category, region).
func derivedTag(category, region string) string {
	return tags.Tag{Table: "public.items", Columns: regionSet, Values: []string{category, region}}.String()
}

// A derived set publishes, for every change of items or users, the groups
// of (category, seller's region) that rows entered, left or changed in.
// A change of an items row carries its key (in brackets) on its groups'
// tags; a group changed through a user (referencing rows) carries none,
// nor does a group that both did in one transaction.
func TestDerivedSetTags(t *testing.T) {
	h := newHarness(t, derivedDDL)
	cfg := h.config()
	cfg.TagColumns = derivedSets()
	h.start(cfg)

	d := func(c, r string) string { return derivedTag(c, r) }
	cases := []struct {
		name  string
		stmts []string
		want  string
	}{
		{"a new item: its seller's region", []string{"INSERT INTO items VALUES (11, 5, 2, 'ink', 0)"},
			d("5", "2") + ":rows[11] public.items(id)=11:rows[11] public.items:rows"},
		{"a bid: a column change in its group", []string{"UPDATE items SET max_bid = 3 WHERE id = 10"},
			d("5", "1") + ":cols=max_bid[10] public.items(id)=10:cols=max_bid[10] public.items:cols=max_bid"},
		{"a user's other column: no group changes", []string{"UPDATE users SET nickname = 'anna' WHERE id = 1"},
			"public.users(id)=1:all[1] public.users:all"},
		{"a user moves: their items leave one region's group for another's", []string{"UPDATE users SET region = 3 WHERE id = 1"},
			d("5", "1") + ":rows " + d("5", "3") + ":rows public.users(id)=1:all[1] public.users:all"},
		{"a new user no item names: no group", []string{"INSERT INTO users VALUES (3, 'cy', 2)"},
			"public.users(id)=3:rows[3] public.users:rows"},
		{"an item whose seller does not exist: no group", []string{"INSERT INTO items VALUES (12, 6, 99, 'cup', 0)"},
			"public.items(id)=12:rows[12] public.items:rows"},
		{"its seller appears: the item enters a group", []string{"INSERT INTO users VALUES (99, 'zed', 4)"},
			d("6", "4") + ":rows public.users(id)=99:rows[99] public.users:rows"},
		{"another seller in another region", []string{"UPDATE items SET seller = 2 WHERE id = 10"},
			d("5", "2") + ":rows[10] " + d("5", "3") + ":rows[10] public.items(id)=10:cols=seller[10] public.items:cols=seller"},
		{"another seller in the same region: a column change", []string{"UPDATE items SET seller = 3 WHERE id = 11"},
			d("5", "2") + ":cols=seller[11] public.items(id)=11:cols=seller[11] public.items:cols=seller"},
		{"a user and an item in one transaction", []string{"UPDATE users SET region = 8 WHERE id = 3", "UPDATE items SET category = 7 WHERE id = 11"},
			d("5", "2") + ":rows " + d("5", "8") + ":rows " + d("7", "8") + ":rows[11] public.items(id)=11:cols=category[11] public.items:cols=category public.users(id)=3:all[3] public.users:all"},
		{"a seller deleted: their items leave", []string{"DELETE FROM users WHERE id = 2"},
			d("5", "2") + ":rows public.users(id)=2:rows[2] public.users:rows"},
		{"a truncation of users: the set's own tag", []string{"TRUNCATE users"},
			"flush:public.users " + tags.SetTag("public.items", regionSet).String() + ":rows public.users:rows"},
		{"indexed again after it", []string{"INSERT INTO users VALUES (2, 'bob', 7)"},
			d("5", "7") + ":rows public.users(id)=2:rows[2] public.users:rows"},
		{"a deleted item leaves its group", []string{"DELETE FROM items WHERE id = 10"},
			d("5", "7") + ":rows[10] public.items(id)=10:rows[10] public.items:rows"},
	}
	for _, c := range cases {
		got := describeKeys(h.step(c.stmts...))
		if got != c.want {
			t.Errorf("%s:\n got %s\nwant %s", c.name, got, c.want)
		}
	}
}

// The commits a restarted session decodes again up to its index's snapshot
// publish the set's own tag: the snapshot may or may not hold them, so their
// groups are unknown. Later commits publish keyed tags.
func TestDerivedSetAfterRestart(t *testing.T) {
	h := newHarness(t, derivedDDL)
	cfg := h.config()
	cfg.TagColumns = derivedSets()
	h.start(cfg)
	h.step("UPDATE items SET max_bid = 1 WHERE id = 10")
	if err := h.stop(); err != nil {
		t.Fatal(err)
	}
	missed := h.walLSN()
	after := h.exec("UPDATE users SET region = 2 WHERE id = 1")

	rep := newReplicating()
	cfg.Commits = rep
	s := h.startPublisher(cfg)
	rep.wait(t, s)
	setTag := tags.SetTag("public.items", regionSet).String()
	found := false
	for _, txn := range h.until(after) {
		if txn.CommitLSN < uint64(missed) {
			continue
		}
		for _, c := range txn.Changes {
			if c.Tag == setTag && c.Rows {
				found = true
			}
			if strings.HasPrefix(c.Tag, "public.items(category,") && c.Tag != setTag {
				t.Errorf("commit %X decoded again published %s: its groups are not known", txn.CommitLSN, c.Tag)
			}
		}
	}
	if !found {
		t.Fatalf("the commit the session decoded again did not publish the set tag %s", setTag)
	}
	if got, want := describe(h.step("UPDATE users SET region = 3 WHERE id = 1")), derivedTag("5", "2")+":rows "+derivedTag("5", "3")+":rows public.users(id)=1:all public.users:all"; got != want {
		t.Errorf("after the restart:\n got %s\nwant %s", got, want)
	}
}

// A derived set registered at run time is indexed before it is published;
// sets the publisher cannot index are refused with the reason.
func TestRegisterDerivedSet(t *testing.T) {
	h := newHarness(t, derivedDDL)
	cfg := h.config()
	cfg.TagColumns = map[string][][]string{"public.items": {{"id"}}, "public.users": {{"id"}}}
	rep := newReplicating()
	cfg.Commits = rep
	p, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	s := runSession(t, p)
	rep.wait(t, s)
	js, err := jetstream.New(h.nc)
	if err != nil {
		t.Fatal(err)
	}
	if err := h.consume(js, 1); err != nil {
		t.Fatal(err)
	}
	h.until(h.walLSN()) // the new slot's flushes

	nick := []string{tags.DerivedColumn("seller_nick", "public.users", "region")}
	two := []string{tags.DerivedColumn("seller", "public.users", "region"), tags.DerivedColumn("category", "public.regions", "name")}
	out, err := p.Register(context.Background(), invalidation.TagSetsRegistration{Sets: map[string][][]string{
		"public.items": {regionSet, nick, two},
	}})
	if err != nil {
		t.Fatal(err)
	}
	if out.Effective == 0 {
		t.Fatalf("the derived set was not registered: %+v", out)
	}
	for _, set := range [][]string{nick, two} {
		if why := out.Refused[invalidation.SetName("public.items", set)]; why == "" {
			t.Errorf("set %v not refused: %+v", set, out.Refused)
		} else {
			t.Logf("refused %v: %s", set, why)
		}
	}
	if _, ok := out.Refused[invalidation.SetName("public.items", regionSet)]; ok {
		t.Fatalf("refused the region set: %+v", out.Refused)
	}
	if !containsSet(out.Reply.Tables["public.items"], regionSet) {
		t.Fatalf("the reply does not list the set: %+v", out.Reply.Tables)
	}
	if got, want := describe(h.step("UPDATE users SET region = 4 WHERE id = 1")), derivedTag("5", "1")+":rows "+derivedTag("5", "4")+":rows public.users(id)=1:all public.users:all"; got != want {
		t.Errorf("after the registration:\n got %s\nwant %s", got, want)
	}
}

// The index's rules on their own: keys, counts and NULLs.
func TestDerivedIndexRules(t *testing.T) {
	if _, err := newDerivedIndex("public.items", []string{"category"}); err == nil {
		t.Error("a set without a derived column was taken")
	}
	ix, err := newDerivedIndex("public.items", []string{tags.DerivedColumn("seller", "public.users", "region"), "category"})
	if err != nil {
		t.Fatal(err)
	}
	ix.byFK = map[string]map[string]int{}
	ix.addA("1", "5")
	ix.addA("1", "5")
	ix.removeA("1", "5")
	if ix.byFK["1"]["5"] != 1 {
		t.Fatalf("counts: %v", ix.byFK)
	}
	ix.removeA("1", "5")
	if len(ix.byFK) != 0 {
		t.Fatalf("an empty foreign key kept: %v", ix.byFK)
	}
	tag, ok := ix.tag("5", []value{{known: true, text: "7"}})
	want := tags.Tag{Table: "public.items", Columns: ix.columns, Values: []string{"7", "5"}}.String()
	if !ok || tag != want {
		t.Fatalf("tag = %q %v", tag, ok)
	}
	if _, ok := ix.tag("5", []value{{known: true, null: true}}); ok {
		t.Fatal("a NULL region put the row in a group")
	}
}

// A commit decoded again after a restart that the index's snapshot already
// holds is not applied twice: the items of a seller are counted once, and a
// later move of the seller still publishes their group.
func TestDerivedReplayNotAppliedTwice(t *testing.T) {
	h := newHarness(t, derivedDDL+"INSERT INTO items VALUES (11, 5, 1, 'ink', 0);")
	cfg := h.config()
	cfg.TagColumns = derivedSets()
	h.start(cfg)
	h.step("UPDATE items SET max_bid = 1 WHERE id = 10")
	if err := h.stop(); err != nil {
		t.Fatal(err)
	}
	// Decoded again after the restart, and in the index's snapshot: were
	// it applied, user 1 would have no item left in the index.
	after := h.exec("DELETE FROM items WHERE id = 10")
	rep := newReplicating()
	cfg.Commits = rep
	s := h.startPublisher(cfg)
	rep.wait(t, s)
	h.until(after)
	if got, want := describe(h.step("UPDATE users SET region = 3 WHERE id = 1")), derivedTag("5", "1")+":rows "+derivedTag("5", "3")+":rows public.users(id)=1:all public.users:all"; got != want {
		t.Errorf("user 1 moved, item 11 still theirs:\n got %s\nwant %s", got, want)
	}
}

func TestWidenXID(t *testing.T) {
	for _, c := range []struct {
		xid  uint32
		ref  uint64
		want uint64
	}{
		{5, 10, 5},
		{4294967290, 1<<32 + 10, 4294967290},
		{10, 1<<32 - 5, 1<<32 + 10},
		{100, 3<<32 + 50, 3<<32 + 100},
	} {
		if got := widenXID(c.xid, c.ref); got != c.want {
			t.Errorf("widenXID(%d, %d) = %d, want %d", c.xid, c.ref, got, c.want)
		}
	}
	xmin, xmax, xip, err := parseSnapshot("10:20:12,15")
	if err != nil || xmin != 10 || xmax != 20 || !xip[12] || !xip[15] || len(xip) != 2 {
		t.Fatalf("parseSnapshot: %d %d %v %v", xmin, xmax, xip, err)
	}
	ix := &derivedIndex{snapXmin: xmin, snapXmax: xmax, snapXip: xip}
	for xid, want := range map[uint32]bool{9: true, 11: true, 12: false, 19: true, 20: false, 25: false} {
		if ix.inSnapshot(xid) != want {
			t.Errorf("inSnapshot(%d) = %v, want %v", xid, !want, want)
		}
	}
}

// A derived set through a table the invalidator does not cover is not
// published: that table's changes are never decoded.
func TestDerivedSetNeedsTheReferencedTableCovered(t *testing.T) {
	h := newHarness(t, derivedDDL)
	cfg := h.config()
	cfg.Tables = []string{"public.items"}
	cfg.TagColumns = derivedSets()
	h.start(cfg)
	if got := describe(h.step("INSERT INTO items VALUES (11, 5, 2, 'ink', 0)")); got != "public.items(id)=11:rows public.items:rows" {
		t.Errorf("an insert published %s; want no derived tag", got)
	}
}
