package main

import (
	"context"
	"fmt"

	"github.com/redis/go-redis/v9"

	"github.com/larderdb/larder/cache-node/redisstore"
	"github.com/larderdb/larder/cache-node/store"
)

// openRedis fronts the Redis at o.store, with o.memory as its budget.
type redisBackend struct {
	*redisstore.Store
	client *redis.Client
}

func (b redisBackend) Close() error {
	err := b.Store.Close()
	if cerr := b.client.Close(); err == nil {
		err = cerr
	}
	return err
}

func openRedis(ctx context.Context, o options) (store.Backend, error) {
	opts, err := redis.ParseURL(o.store)
	if err != nil {
		return nil, fmt.Errorf("--store: %w", err)
	}
	client := redis.NewClient(opts)
	s, err := redisstore.New(ctx, redisstore.Options{Client: client, Prefix: o.prefix, MaxMemory: o.memory})
	if err != nil {
		client.Close()
		return nil, fmt.Errorf("redis store %s: %w", o.store, err)
	}
	return redisBackend{Store: s, client: client}, nil
}
