package tags

import "testing"

func TestNames(t *testing.T) {
	cases := []struct {
		tag  Tag
		want string
	}{
		{TableTag("public.items"), "public.items"},
		{Tag{Table: "public.items", Columns: []string{"id"}, Values: []string{"42"}}, "public.items(id)=42"},
		{Tag{Table: "public.bids", Columns: []string{"item_id", "user_id"}, Values: []string{"7", "3"}}, "public.bids(item_id,user_id)=(7,3)"},
		{Tag{Table: "public.users", Columns: []string{"nickname"}, Values: []string{"o'brien"}}, "public.users(nickname)='o''brien'"},
		{Tag{Table: "public.users", Columns: []string{"nickname"}, Values: []string{""}}, "public.users(nickname)=''"},
		{Tag{Table: "Odd.Ta ble", Columns: []string{"Col"}, Values: []string{"a,b"}}, `"Odd"."Ta ble"("Col")='a,b'`},
		{Tag{Table: "public.t", Columns: []string{"a", "b"}, Values: []string{"x", "y,z"}}, "public.t(a,b)=(x,'y,z')"},
	}
	for _, c := range cases {
		if got := c.tag.String(); got != c.want {
			t.Errorf("%#v.String() = %s, want %s", c.tag, got, c.want)
		}
	}
}

// TestNamesAreUnambiguous checks that values that look alike name different tags.
func TestNamesAreUnambiguous(t *testing.T) {
	seen := map[string][]string{}
	vals := [][]string{{"a,b", "c"}, {"a", "b,c"}, {"'a'", "b"}, {"a", "b"}, {"", "ab"}, {"a)", "b"}, {"a", ")b"}}
	for _, v := range vals {
		n := Tag{Table: "public.t", Columns: []string{"x", "y"}, Values: v}.String()
		if prev, dup := seen[n]; dup {
			t.Fatalf("%v and %v share the name %s", prev, v, n)
		}
		seen[n] = v
	}
}

func FuzzTagNamesInjective(f *testing.F) {
	f.Add("a", "b", "a,b", "")
	f.Add("'", "''", "x)", "(")
	f.Fuzz(func(t *testing.T, a, b, c, d string) {
		t1 := Tag{Table: "public.t", Columns: []string{"x", "y"}, Values: []string{a, b}}
		t2 := Tag{Table: "public.t", Columns: []string{"x", "y"}, Values: []string{c, d}}
		if (t1.String() == t2.String()) != (a == c && b == d) {
			t.Fatalf("%q,%q vs %q,%q: names %s / %s", a, b, c, d, t1, t2)
		}
	})
}

func TestDerivedColumn(t *testing.T) {
	name := DerivedColumn("seller", "public.users", "region")
	if name != "seller->public.users.region" {
		t.Fatalf("DerivedColumn = %q", name)
	}
	fk, table, col, ok := ParseDerivedColumn(name)
	if !ok || fk != "seller" || table != "public.users" || col != "region" {
		t.Fatalf("ParseDerivedColumn(%q) = %q %q %q %v", name, fk, table, col, ok)
	}
	for _, plain := range []string{"seller", "a->b", "->public.users.region", "seller->users.region", "seller->public.users."} {
		if _, _, _, ok := ParseDerivedColumn(plain); ok {
			t.Errorf("ParseDerivedColumn(%q) ok", plain)
		}
	}
	if !IsDerivedSet([]string{"category", name}) || IsDerivedSet([]string{"category"}) {
		t.Error("IsDerivedSet")
	}
	set := SetTag("public.items", []string{"category", name}).String()
	keyed := Tag{Table: "public.items", Columns: []string{"category", name}, Values: []string{"", ""}}.String()
	if set != `public.items(category,"seller->public.users.region")=` || set == keyed {
		t.Fatalf("SetTag = %q (keyed with empty values %q)", set, keyed)
	}
}
