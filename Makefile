# Larder — the two commands:
#   make demo   installs what is missing, then runs the main job
#   make test   installs what is missing, then checks formatting, vets, lints and runs every test
#               (the core packages with the race detector)
SHELL := /bin/bash
GO ?= go
GOBIN := $(shell $(GO) env GOPATH)/bin
STATICCHECK := $(GOBIN)/staticcheck
# One go test over every package keeps the build cache warm; 2 packages at a time fits 2 cores.
GOTEST_FLAGS ?= -count=1 -timeout 25m -p 2

.PHONY: all deps test lint fmt-check vet staticcheck gotest demo up clean history bench-rubis bench-wan bench-pgpool

all: test

deps:
	bash deploy/install-deps.sh

test: deps lint gotest

lint: fmt-check vet staticcheck

fmt-check:
	@out=$$(gofmt -l $$(git ls-files '*.go' 2>/dev/null || find . -name '*.go')); \
	if [ -n "$$out" ]; then echo "gofmt: these files need formatting:"; echo "$$out"; exit 1; fi; \
	echo "gofmt: clean"

vet:
	$(GO) vet ./...

staticcheck:
	$(STATICCHECK) ./...

# The core packages (the cache-node's store, node and protocol, and the
# client library) run with the race detector; the others without.
RACE_PKGS := ./cache-node/node ./cache-node/store ./cache-node/protocol ./client-lib

gotest:
	$(GO) test $(GOTEST_FLAGS) $$($(GO) list ./... | grep -v -x $(foreach p,$(RACE_PKGS),-e github.com/larderdb/larder/$(patsubst ./%,%,$(p))))
	$(GO) test -race $(GOTEST_FLAGS) $(RACE_PKGS)

# A longer run of the history checker (client-lib): writers on PostgreSQL,
# read-only transactions through Larder, every transaction checked, under
# each fault schedule: the cache-node, the invalidator and NATS restarted;
# the node's NATS connection cut; a Redis-backed node killed; redis-server
# restarted; the replication slot dropped; DDL. HISTORY_SECONDS per case.
HISTORY_SECONDS ?= 60
history: deps
	LARDER_HISTORY_SECONDS=$(HISTORY_SECONDS) $(GO) test -count=1 -timeout 60m -run 'TestSnapshotConsistency|TestHistoryUnderFaults/.*/broken=false' -v ./client-lib

# RUBiS side by side (direct, larder, larder-nocons, local-only, and the PHP
# application on PostgreSQL and through the front: php-direct, php-larder) at rising
# client counts on a stack of its own, the modes taking turns in 3 repeats
# (the report gives the median and the spread); the report goes to
# bench/rubis/results. BENCH_ARGS passes flags to rubis-bench (see its
# -help; a later --repeats wins).
BENCH_ARGS ?=
bench-rubis: deps
	bash bench/rubis/bench.sh --repeats 3 $(BENCH_ARGS)

# Larder over an emulated WAN (bench/wan): RUBiS's browsing and bidding mixes
# and a data-heavy listing at 5 Mb/s / 66 ms, 20 Mb/s / 33 ms and 100 Mb/s / 0,
# edge app → (a) PostgreSQL across the link, (b) Larder with the origin sending
# rows verbatim, (c) with recipes; a site of its own in $(BENCH_DIR)/wan (the
# ports of bench-rubis). The report goes to bench/wan/results. WAN_ARGS passes
# flags to wan-bench (see its -help).
WAN_ARGS ?=
bench-wan: deps
	$(GO) run ./bench/wan/cmd/wan-bench --dir $${BENCH_DIR:-.larder-bench}/wan --pg-port $${BENCH_PG_PORT:-25432} --nats-port $${BENCH_NATS_PORT:-24222} --out bench/wan/results $(WAN_ARGS)

# Pgpool-II's in-memory query cache beside direct and larder (Debian's
# pgpool2, installed with apt-get when missing), both mixes at demo scale,
# then the consistency contrast of the two caches (bench/rubis/README.md,
# "Pgpool-II"). BENCH_ARGS passes flags to rubis-bench.
bench-pgpool: deps
	bash bench/rubis/pgpool.sh --modes direct,larder --vus 8 --duration 15s --warmup 5s --scale 0.05 --mix browsing --out bench/rubis/results/pgpool-browsing $(BENCH_ARGS)
	bash bench/rubis/pgpool.sh --modes direct,larder --vus 8 --duration 15s --warmup 5s --scale 0.05 --mix bidding --out bench/rubis/results/pgpool-bidding $(BENCH_ARGS)
	bash bench/rubis/pgpool.sh --check --duration 65s

# The main job: the local stack with two cache-nodes in an overlay, one round
# trip through the cache, a key read through one node from its master on the
# other, then a short RUBiS comparison of plain PostgreSQL and Larder in both
# mixes (browsing, then bidding): larder (a cache-node), local-only (the
# application's in-process L1 alone); a 5 s warm-up and 10 s measured per
# mode and mix, a stack start per mix: about three minutes.
demo: deps
	$(GO) run ./deploy/local demo -cache-nodes 2
	@echo
	@echo "RUBiS, direct vs larder (a cache-node) and local-only (the in-process L1 alone), browsing mix (a short run at demo scale; make bench-rubis for the full report):"
	bash bench/rubis/bench.sh --modes direct,larder,local-only --vus 8 --duration 10s --warmup 5s --scale 0.05 --mix browsing --out bench/rubis/results/demo
	@echo
	@echo "RUBiS, direct vs larder and local-only, bidding mix (writes: bids, comments, buy-nows, registrations):"
	bash bench/rubis/bench.sh --modes direct,larder,local-only --vus 8 --duration 10s --warmup 5s --scale 0.05 --mix bidding --out bench/rubis/results/bidding-demo

# The local stack, kept running until Ctrl-C.
up: deps
	$(GO) run ./deploy/local up

clean:
	rm -rf .larder-local
