package redisstore

import (
	"fmt"
	"math/rand"
	"testing"

	"github.com/larderdb/larder/cache-node/store"
)

var benchSizes = []int{1 << 10, 16 << 10}

// benchKey holds three versions, the newest open: a lookup chooses among
// them.
func putBenchKey(b *testing.B, s store.Backend, key string, size int) []byte {
	val := make([]byte, size)
	rand.New(rand.NewSource(int64(size))).Read(val)
	deps := []store.Dep{
		{Tag: "public.items(id)=42", Table: "public.items", Reads: []string{"name", "price"}},
		{Tag: "public.users(id)=7", Table: "public.users", AllColumns: true},
	}
	mustPut(b, s, key, store.Version{Lo: 100, Hi: 200, Snapshot: 150, Deps: deps, Value: val})
	mustPut(b, s, key, store.Version{Lo: 200, Hi: 300, Snapshot: 250, Deps: deps, Value: val})
	mustPut(b, s, key, store.Version{Lo: 300, Hi: store.Open, Snapshot: 320, Deps: deps, Value: val})
	return val
}

func benchLookup(b *testing.B, s store.Backend, size int) {
	key := "0123456789abcdef0123456789abcdef" // keys are 32-byte hashes
	putBenchKey(b, s, key, size)
	b.SetBytes(int64(size))
	b.ResetTimer()
	for range b.N {
		r, err := s.Lookup(ctx, []byte(key), 400, 500, 500)
		if err != nil || r.Miss != store.Hit || len(r.Value) != size {
			b.Fatalf("%+v %v", r.Miss, err)
		}
	}
}

// BenchmarkLookupHit: a lookup that hits the newest of three versions of
// a key, on the Redis store.
func BenchmarkLookupHit(b *testing.B) {
	for _, size := range benchSizes {
		b.Run(fmt.Sprintf("%dKiB", size>>10), func(b *testing.B) { benchLookup(b, sharedStore(b), size) })
	}
}

// BenchmarkRedisGET: a plain GET of the same payload through the same
// kind of client, the floor a lookup is compared with.
func BenchmarkRedisGET(b *testing.B) {
	for _, size := range benchSizes {
		b.Run(fmt.Sprintf("%dKiB", size>>10), func(b *testing.B) {
			c := newClient(b, env.Redis)
			key := fmt.Sprintf("bench-get-%d", size)
			val := make([]byte, size)
			rand.New(rand.NewSource(int64(size))).Read(val)
			if err := c.Set(ctx, key, val, 0).Err(); err != nil {
				b.Fatal(err)
			}
			b.SetBytes(int64(size))
			b.ResetTimer()
			for range b.N {
				got, err := c.Get(ctx, key).Bytes()
				if err != nil || len(got) != size {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkMemoryLookupHit: the same lookup on the memory backend.
func BenchmarkMemoryLookupHit(b *testing.B) {
	for _, size := range benchSizes {
		b.Run(fmt.Sprintf("%dKiB", size>>10), func(b *testing.B) { benchLookup(b, store.NewMemory(1<<30, nil), size) })
	}
}
