# p2pnode — the targets people and CI use.
SHELL := /bin/bash
export PATH := $(PATH):/usr/local/go/bin
GO ?= go
PY ?= /usr/bin/python3
BIN := bin/p2pnode
# The release `p2pnode --version` reports, and the VCS revision, linked in from git so that it
# is there even when go build records none (GOFLAGS=-buildvcs=false).
VERSION ?= 0.1.0
REVISION ?= $(shell rev=$$(git rev-parse --short=12 HEAD 2>/dev/null) && { git diff --quiet HEAD -- 2>/dev/null && echo $$rev || echo $$rev+dirty; })
LDFLAGS := -X github.com/p2pnode/p2pnode/internal/version.Version=$(VERSION) -X github.com/p2pnode/p2pnode/internal/version.LinkedRevision=$(REVISION)
# Go build tags. TAGS=attack builds the test binary whose `run --poison MODE` makes a trainer
# misbehave on purpose (docs/security.md); the default build has no such flag.
TAGS ?=

.PHONY: all setup setup-demo build release image demo demo-local learn test test-go test-attack test-attack-matrix test-half-matrix test-half-matrix-full test-py bench bench-scale e2e wan wan-goodput wan-goodput-grid wan-holepunch wan-nat-roles wan-faults wan-lab lint clean

all: build

## setup: install missing Debian packages (torch, numpy, sklearn, openblas) and Go modules
setup:
	@scripts/setup.sh

## build: build bin/p2pnode (static, so the same binary runs in the Docker image)
build:
	CGO_ENABLED=0 $(GO) build -trimpath -tags '$(TAGS)' -ldflags "$(LDFLAGS)" -o $(BIN) ./cmd/p2pnode

## release: RELEASE_DIR (dist)/p2pnode-VERSION-linux-{amd64,arm64}.tar.gz (the static binary,
## README, the systemd unit) and their SHA256SUMS; the same checkout gives the same bytes
## (files dated SOURCE_DATE_EPOCH, the commit's time), so anyone can rebuild and compare sums
RELEASE_DIR ?= dist
SOURCE_DATE_EPOCH ?= $(shell git log -1 --format=%ct 2>/dev/null || echo 0)
RELEASE_ARCHS ?= amd64 arm64
release:
	@test -n "$(REVISION)" || { echo "release: no git revision (not a git checkout?): set REVISION=" >&2; exit 1; }
	rm -rf $(RELEASE_DIR) && mkdir -p $(RELEASE_DIR)
	@set -e; for arch in $(RELEASE_ARCHS); do \
		name=p2pnode-$(VERSION)-linux-$$arch; mkdir -p $(RELEASE_DIR)/$$name; \
		echo "release: $$name (revision $(REVISION))"; \
		CGO_ENABLED=0 GOOS=linux GOARCH=$$arch $(GO) build -trimpath -ldflags "$(LDFLAGS)" -o $(RELEASE_DIR)/$$name/p2pnode ./cmd/p2pnode; \
		cp README.md docker/p2pnode.service $(RELEASE_DIR)/$$name/; \
		chmod -R u=rwX,go=rX $(RELEASE_DIR)/$$name; \
		tar -C $(RELEASE_DIR) --sort=name --mtime=@$(SOURCE_DATE_EPOCH) --owner=0 --group=0 --numeric-owner -cf - $$name | gzip -9n > $(RELEASE_DIR)/$$name.tar.gz; \
		rm -rf $(RELEASE_DIR)/$$name; \
	done
	cd $(RELEASE_DIR) && sha256sum *.tar.gz > SHA256SUMS && cat SHA256SUMS

## setup-demo: only what training needs (no Chromium, matplotlib or venv tooling)
setup-demo:
	@scripts/setup.sh demo

## demo: set up, build, and run the default experiment (a local swarm: 1 validator, 3 trainers)
demo: setup-demo build
	$(BIN) demo

## demo-local: one node (validator+trainer) training digits with DiLoCo
demo-local: setup-demo build
	$(BIN) run --config configs/digits-local.yaml

## learn: how the swarm learns on lm tiny (CPU): `p2pnode demo --workload lm` for every codec and
## overlap setting over SEEDS, beside plain-PyTorch DiLoCo (p2ptrain.tools.diloco_lm_reference)
## and one node with the same samples (and, with sparse among CODECS, that DiLoCo with its updates
## through the sparse codec in PyTorch); prints per-round held-out loss and the gaps as tables and
## writes LEARN_OUT/learn.png and learn.json. SEEDS (1,2,3), ROUNDS (12), TRAINERS (2), CODECS
## (fp32,sparse), OVERLAP (none; none,eager adds the overlap runs), LEARN_OUT (.p2pnode/learn).
## One 12-round swarm took 280 s on 2 cores (started at load 8) and 463 s at load 23, so the defaults'
## six swarms are about half an hour on a quiet machine, plus the references; quick:
## make learn SEEDS=1 ROUNDS=4 CODECS=sparse
SEEDS ?= 1,2,3
ROUNDS ?= 12
TRAINERS ?= 2
CODECS ?= fp32,sparse
OVERLAP ?= none
LEARN_OUT ?= .p2pnode/learn
learn: setup build
	$(PY) scripts/learn.py --bin $(BIN) --python $(PY) --seeds $(SEEDS) --rounds $(ROUNDS) --trainers $(TRAINERS) \
		--codecs $(CODECS) --overlap $(OVERLAP) --out $(LEARN_OUT)

## test: set up, then run every Go test (race detector, shuffled) and every Python test
test: setup test-go test-py

test-go:
	$(GO) vet ./...
	$(GO) vet -tags attack ./...
	@# e2e and node first: go test starts packages in the order given, two at a time on two
	@# cores, and these are the long ones (node waits on timers for ~10 min, e2e runs real
	@# processes for ~6); in the default, alphabetical order node started 3-7 minutes in and ran
	@# alone at the end (go test ./... took 796 s here, this order 689 s).
	$(GO) test -race -shuffle=on -timeout 30m ./e2e/ ./node/ ./...
	@# The 16-trainer scale cluster (issue 16) runs alone, after the packages above: beside
	@# the e2e package's real processes its 19 in-process nodes starve for CPU on 2 cores.
	P2PNODE_SCALE_16=1 $(GO) test -race -count=1 -timeout 10m -run 'TestMocknetScale16Trainers$$' ./node/
	@# The attack build's tests and the one-third-attackers matrix, side by side: both mostly
	@# wait on round timers (about a third of a core each), so together they take the time of
	@# the matrix alone.
	$(MAKE) --no-print-directory -j2 --output-sync=target test-attack test-attack-matrix
	@# The half matrix's short form (4 honest + 4 attackers) after them, alone.
	$(MAKE) --no-print-directory test-half-matrix

# The tests that need the attack build's hooks (adversary, node/attack.go): the in-process
# attackers and the attack build's --poison flag.
test-attack:
	$(GO) test -race -shuffle=on -count=1 -tags attack -timeout 15m -run 'TestAttackersAreScreenedOut$$|TestRejectedPeerIsNotLeasedAgainInItsRound$$|TestDisagreeingPairIsLeasedOneAtATime$$|TestTrainerIsToldOfRejectionAndQuarantine$$|TestYoungChainOneAttackerFirst$$|TestYoungChainHalfAttackersFirst$$|TestRunPoisonFlagInAttackBuild$$' ./node/ ./cmd/p2pnode/

# The one-third-attackers matrix, short form (issue 12, docs/security.md).
test-attack-matrix:
	P2PNODE_ATTACK_MATRIX=short $(GO) test -race -count=1 -tags attack -timeout 15m -run 'TestOneThirdAttackers$$' ./node/

# The half matrix (issue 42, docs/security.md): short form, 4 honest + 4 attackers mixed,
# one row at a time against one clean run (as its table in docs/security.md was measured).
test-half-matrix:
	P2PNODE_HALF_MATRIX=short P2PNODE_ATTACK_PARALLEL=1 $(GO) test -race -count=1 -tags attack -timeout 30m -run 'TestHalfAttackers$$' ./node/

# Its full form, 8 honest + 8 attackers, one row at a time (not in `make test`).
test-half-matrix-full:
	P2PNODE_HALF_MATRIX=1 $(GO) test -race -count=1 -tags attack -timeout 90m -run 'TestHalfAttackers$$' -v ./node/

test-py:
	$(PY) -m unittest discover -s scripts/tests
	cd pyruntime/python && $(PY) -m unittest discover -s tests -t . -v 2>&1 | tail -n 40; exit $${PIPESTATUS[0]}

## bench: run the benchmarks and print a table of ratios against same-run baselines
bench: setup
	scripts/bench.sh

## bench-scale: one full round per model size and trainer count, every node a real p2pnode
## process (loopback TCP, its own store) on the synthetic workload padded to the size (run in
## a worker process per call, as the Python worker is); prints seconds per stage (lease, fetch
## head, train, encode, upload, screen, merge, eval, sign, attest, checkpoint), MB moved and
## peak RSS per role over model bytes. Rows that need more disk or RAM than is free say what
## they would need. Not part of `make test`. BENCH_SCALE_SIZES (1M,10M,100M,1B),
## BENCH_SCALE_TRAINERS (3,8,16), BENCH_SCALE_VALIDATORS (2), BENCH_SCALE_ROUNDS (2: the table
## shows the last), BENCH_SCALE_DIR ($$TMPDIR/p2pnode-bench-scale), BENCH_SCALE_TIMEOUT (30m a
## row), BENCH_SCALE_KEEP=1 keeps stores and logs. Quick: BENCH_SCALE_SIZES=1M,10M BENCH_SCALE_TRAINERS=3
bench-scale:
	$(GO) run ./cmd/benchscale

## image: the Docker image p2pnode:latest from bin/p2pnode. With no registry (here) the base
## is debootstrapped and imported once, then cached; BASE_IMAGE=debian:bookworm-slim builds
## from a public image instead.
IMAGE ?= p2pnode:latest
image: build
	BIN=$(BIN) IMAGE=$(IMAGE) docker/build-image.sh

## e2e: multi-node end-to-end tests: the process harness, and the docker-compose scenarios
## when a Docker engine answers (the image is built first, from the attack build: the poison
## scenario's trainer runs `p2pnode run --poison`). E2E_RUN=regexp picks tests.
E2E_RUN ?= .
e2e: setup
	@if docker info >/dev/null 2>&1; then $(MAKE) --no-print-directory image TAGS=attack BIN=bin/p2pnode-attack IMAGE=p2pnode-attack:latest; \
	else echo "e2e: no Docker engine answers: the docker-compose scenarios will skip"; fi
	P2PNODE_IMAGE=p2pnode-attack:latest $(GO) test -tags e2e -timeout 60m -v -run '$(E2E_RUN)' ./e2e/

## wan: the digits swarm with every node in its own network namespace, trainers on
## rate-limited home links (tc tbf, 20 Mbit/s up, 100 down); prints bytes on each trainer's
## wire (interface counters), training vs wall seconds per round. Needs root, ip and tc.
## WAN_CODEC (sparse), WAN_ROUNDS (4), WAN_TRAINERS (3), WAN_UP_MBIT, WAN_DOWN_MBIT, WAN_HIDDEN,
## WAN_INNER_STEPS.
wan: setup
	$(GO) test -tags wan -count=1 -timeout 60m -v -run '^TestWANSwarm$$' ./e2e/ | grep -v '^=== \|^--- SKIP'; exit $${PIPESTATUS[0]}

## wan-goodput: a 40 MB artifact over a 20 Mbit/s uplink, raw TCP (one flow and four) vs the
## artifact protocol over TCP, over QUIC and as the node dials (TCP first). WAN_SIZE_MB (40),
## WAN_REPS (2), WAN_UP_MBIT (20), WAN_DOWN_MBIT (100), WAN_RTT_MS and WAN_LOSS_PCT (the
## holder's distance and loss), WAN_FRAMES=1 (also yamux's default 64 KiB frames), WAN_QUIC=0
## (not over QUIC alone), WAN_CHECK=0 (print only), WAN_YAMUX_INIT_WINDOW (yamux's initial
## stream window, bytes), WAN_STREAMS (the fetcher's streams to the holder), WAN_HOLDERS=2 (a
## second holder on a like link: one raw flow from each, and the protocol from both).
wan-goodput:
	$(GO) test -tags wan -count=1 -timeout 30m -v -run '^TestWANGoodput$$' ./e2e/ | grep -v '^=== \|^--- SKIP'; exit $${PIPESTATUS[0]}

## wan-goodput-grid: wan-goodput at every RTT of WAN_RTTS (20 100 250 ms) and loss of
## WAN_LOSSES (0 0.5 2 %) on a WAN_UP_MBIT (100) Mbit/s link, a table each (issue 46 item 3).
WAN_RTTS ?= 20 100 250
WAN_LOSSES ?= 0 0.5 2
wan-goodput-grid:
	@set -o pipefail; fail=0; for rtt in $(WAN_RTTS); do for loss in $(WAN_LOSSES); do \
		WAN_UP_MBIT=$${WAN_UP_MBIT:-100} WAN_DOWN_MBIT=$${WAN_DOWN_MBIT:-100} WAN_RTT_MS=$$rtt WAN_LOSS_PCT=$$loss \
			$(MAKE) --no-print-directory wan-goodput | grep -v '^go test\|^ok\|^PASS' || fail=1; \
	done; done; exit $$fail

## wan-holepunch: DCUtR hole punching between two homes through a relay, per pair of NAT
## kinds and transport. WAN_HP_ATTEMPTS (50), WAN_HP_PAIRS (5), WAN_HP_TRANSPORTS (tcp,quic).
wan-holepunch:
	$(GO) test -tags wan -count=1 -timeout 40m -v -run '^TestWANHolePunch$$' ./e2e/ | grep -v '^=== \|^--- SKIP'; exit $${PIPESTATUS[0]}

## wan-nat-roles: the NAT lab's other roles (tag wan): a late joiner behind NAT catches up,
## from the validator and over a hole-punched connection from the trainer behind the other
## cone router, and is merged (TestNATLateJoiner; WAN_HIDDEN, WAN_INNER_STEPS size the model
## and the window), and a second validator behind a cone router, quorum 2,
## attests every round it does not lead and leads rounds, fetching the updates of trainers
## behind NAT through the relay or, behind cone routers, a hole-punched connection
## (TestNATSecondValidator; WAN_V2_NAT=none: public; WAN_HOLEPUNCH=0: no hole punching;
## WAN_ROUNDS, WAN_DIR keeps stores and logs, WAN_GOLOG sets go-libp2p's log levels, e.g.
## p2p-holepunch=debug). Needs root, ip, nft and /dev/net/tun.
wan-nat-roles: setup
	$(GO) test -tags wan -count=1 -timeout 30m -v -run '^TestNATLateJoiner$$|^TestNATSecondValidator$$' ./e2e/ | grep -v '^=== \|^--- SKIP'; exit $${PIPESTATUS[0]}

## wan-faults: the home spec's swarm meets faults (issue 46 item 5, tag wan): a trainer behind
## NAT cut off for WAN_CUT_S (30) seconds, another's router forgetting its mappings (conntrack
## flushed, as a reboot does), then the validator (the bootstrap node and relay) killed and
## started again; each must be merged again within 2 rounds, and the audit pass.
## WAN_SPEC, WAN_CUT (trainer-4), WAN_FORGET (trainer-5), WAN_WORKLOAD, WAN_DIR (keeps the
## stores and the nodes' logs there). Needs root, ip, nft,
## conntrack and /dev/net/tun.
wan-faults: setup
	$(GO) test -tags wan -count=1 -timeout 30m -v -run '^TestWANFaults$$' ./e2e/ | grep -v '^=== \|^--- SKIP'; exit $${PIPESTATUS[0]}

## wan-lab: the lab itself (internal/wan, tag wan): round trips within 5 % of the spec, one
## TCP flow on 50 Mbit/s at 100 ms RTT (Cubic and BBR, with and without 1 % loss), the
## forwarder's aggregate throughput, NAT kinds, faults (a cut link, a router's mappings
## forgotten), cleanup after SIGTERM and SIGKILL. Needs root, ip, tc, nft, conntrack and
## /dev/net/tun.
wan-lab:
	$(GO) test -tags wan -count=1 -timeout 20m -v ./internal/wan/ | grep -v '^=== \|^--- SKIP'; exit $${PIPESTATUS[0]}

## lint: formatting and vet
lint:
	@test -z "$$(gofmt -l $$(git ls-files '*.go'))" || { gofmt -l $$(git ls-files '*.go'); exit 1; }
	$(GO) vet ./...
	$(GO) vet -tags attack ./...

clean:
	rm -rf bin .p2pnode data dist
