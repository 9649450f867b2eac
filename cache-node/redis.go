package main

import (
	"context"
	"errors"

	"github.com/larderdb/larder/cache-node/store"
)

func openRedis(context.Context, options) (store.Backend, error) {
	return nil, errors.New("the Redis store is not available in this build")
}
