package overlay

import (
	"crypto/sha256"
	"fmt"
	"testing"

	kbucket "github.com/libp2p/go-libp2p-kbucket"
	"github.com/libp2p/go-libp2p/core/crypto"
	"github.com/libp2p/go-libp2p/core/peer"
)

// fixedIDs are n peer IDs from Ed25519 keys of fixed seeds: the same
// members in every run.
func fixedIDs(t *testing.T, n int) []peer.ID {
	t.Helper()
	ids := make([]peer.ID, n)
	for i := range ids {
		seed := sha256.Sum256(fmt.Appendf(nil, "larder placement test member %d", i))
		k, _, err := crypto.GenerateEd25519Key(&fixedReader{b: seed[:]})
		if err != nil {
			t.Fatal(err)
		}
		if ids[i], err = peer.IDFromPrivateKey(k); err != nil {
			t.Fatal(err)
		}
	}
	return ids
}

// fixedReader reads its bytes, then fails.
type fixedReader struct{ b []byte }

func (r *fixedReader) Read(p []byte) (int, error) {
	if len(r.b) == 0 {
		return 0, fmt.Errorf("fixedReader: exhausted")
	}
	n := copy(p, r.b)
	r.b = r.b[n:]
	return n, nil
}

// shares counts the keys each member masters.
func shares(m *membership, keys [][]byte) map[peer.ID]int {
	got := map[peer.ID]int{}
	for _, k := range keys {
		got[m.master(keyTarget(k))]++
	}
	return got
}

// maxOverMean is the largest member's share over the mean share.
func maxOverMean(s map[peer.ID]int, members, keys int) float64 {
	most := 0
	for _, n := range s {
		most = max(most, n)
	}
	return float64(most) / (float64(keys) / float64(members))
}

// TestVirtualPositionsEvenLoad: with one position each, the keys' masters
// are very unequal among few members (the four fixed members here master
// shares whose largest is well above the mean); with
// DefaultVirtualPositions each, the largest share is within 25% of the
// mean for 4 and 8 members. Deterministic: fixed member IDs and keys.
func TestVirtualPositionsEvenLoad(t *testing.T) {
	keys := testKeys(20000)
	for _, n := range []int{4, 8} {
		ids := fixedIDs(t, n)
		one := maxOverMean(shares(newMembership(ids, 1), keys), n, len(keys))
		many := maxOverMean(shares(newMembership(ids, DefaultVirtualPositions), keys), n, len(keys))
		t.Logf("%d members, %d keys: largest share / mean = %.2f with one position each, %.2f with %d", n, len(keys), one, many, DefaultVirtualPositions)
		if many >= one {
			t.Errorf("%d members: virtual positions did not even out the load (%.2f, one position %.2f)", n, many, one)
		}
		if many > 1.25 {
			t.Errorf("%d members: the largest share is %.2f× the mean with %d positions each; want at most 1.25", n, many, DefaultVirtualPositions)
		}
	}
}

// TestVirtualPositionsMoveOnlyTheLeaversKeys: when a member leaves or
// joins, only the keys it masters (before, or after) change master; every
// member derives the others' positions from their IDs alone, so two
// memberships of the same IDs agree.
func TestVirtualPositionsMoveOnlyTheLeaversKeys(t *testing.T) {
	ids := fixedIDs(t, 8)
	all := newMembership(ids, DefaultVirtualPositions)
	again := newMembership(append([]peer.ID(nil), ids...), DefaultVirtualPositions)
	without := newMembership(ids[1:], DefaultVirtualPositions)
	moved := 0
	for _, k := range testKeys(5000) {
		m := all.master(keyTarget(k))
		if again.master(keyTarget(k)) != m {
			t.Fatalf("key %s: two memberships of the same members disagree", k)
		}
		w := without.master(keyTarget(k))
		if m != ids[0] && w != m {
			t.Fatalf("key %s moved from %s to %s when %s left", k, m, w, ids[0])
		}
		if m == ids[0] {
			moved++
		}
	}
	if moved == 0 {
		t.Fatal("the member that left mastered no key")
	}
}

func keyTarget(k []byte) []byte { return kbucket.ConvertKey(string(k)) }
