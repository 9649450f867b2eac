package larder

import "github.com/larderdb/larder/qumaana/quma"

// splitRows narrows the tags of a result of tpl to its rows when the
// template splits (quma.RowSplit) and the client does (Config.NoRowSplit):
// group tags on the membership columns, and a tag per row on its key for
// the columns the result only shows. A result that cannot be split (a
// NULL or unreadable key, too many rows) keeps qtags whole; both are
// counted. The second result reports whether they were split.
func (c *Client) splitRows(tpl *quma.Template, qtags []quma.QueryTag, res *Result) ([]quma.QueryTag, bool) {
	if !c.splits(tpl) {
		return qtags, false
	}
	split, ok := c.splitTags(tpl, qtags, res)
	if ok {
		c.m.rowSplits.WithLabelValues("split").Inc()
	} else {
		c.m.rowSplits.WithLabelValues("whole").Inc()
	}
	return split, ok
}

// splitTags is splitRows without the count: the tags, and whether they
// were split.
func (c *Client) splitTags(tpl *quma.Template, qtags []quma.QueryTag, res *Result) ([]quma.QueryTag, bool) {
	if !c.splits(tpl) {
		return qtags, false
	}
	split, ok := tpl.SplitRows(qtags, len(res.Rows), res.splitKeys)
	if ok && dropRowTagsForTest {
		split = split[:len(qtags)] // the rows' tags follow qtags
	}
	return split, ok
}

// splits reports whether results of tpl are split by rows: the template
// splits and the client does.
func (c *Client) splits(tpl *quma.Template) bool { return !c.cfg.NoRowSplit && tpl.SplitsRows() }

// dropRowTagsForTest breaks the client on purpose (split results hold no
// row tags), to show that the consistency tests catch it.
var dropRowTagsForTest bool
