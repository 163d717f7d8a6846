"""Eviction policies: the cache contract, each policy's defining behaviour, and speed."""

from __future__ import annotations

import random
import time

import pytest

from ssdmoe_tui.engine.policy.policies import (
    DEFAULT_POLICY,
    POLICY_NAMES,
    BeladyPolicy,
    NoVictimError,
    make_policy,
)
from ssdmoe_tui.errors import BadValueError, user_message

ALL = list(POLICY_NAMES)


class Cache:
    """The engine cache's call pattern, with invariant checks on every victim."""

    def __init__(self, policy, capacity: int) -> None:
        self.policy, self.capacity = policy, capacity
        self.resident: set[tuple[int, int]] = set()
        self.hits = self.lookups = 0

    def layer(self, layer: int, experts, pass_incoming: bool = True) -> None:
        keys = [(layer, e) for e in dict.fromkeys(experts)]
        pinned = frozenset(keys)
        for key in keys:
            self.lookups += 1
            if key in self.resident:
                self.hits += 1
                self.policy.hit(key)
                continue
            if len(self.resident) >= self.capacity:
                v = self.policy.victim(pinned, key) if pass_incoming else self.policy.victim(pinned)
                assert v in self.resident, f"{self.policy.name} chose non-resident {v}"
                assert v not in pinned, f"{self.policy.name} evicted pinned {v}"
                self.policy.remove(v)
                self.resident.discard(v)
            self.policy.insert(key)
            self.resident.add(key)

    def token(self, selections) -> None:
        for layer, experts in enumerate(selections):
            self.layer(layer, experts)
        self.policy.step()

    @property
    def rate(self) -> float:
        return self.hits / self.lookups


def used(policy, key: tuple[int, int], hits: int) -> None:
    """`key` brought into the cache, then found there `hits` times (what the cache tells
    its policy on a miss and on each later hit)."""
    policy.insert(key)
    for _ in range(hits):
        policy.hit(key)


def skewed_stream(tokens: int, layers: int, experts: int, k: int, seed: int = 0):
    """Zipf-ish routing with some token-to-token repetition, like real routers."""
    rng = random.Random(seed)
    weights = [1.0 / (i + 1) for i in range(experts)]
    prev = [rng.sample(range(experts), k) for _ in range(layers)]
    out = []
    for _ in range(tokens):
        sel = []
        for layer in range(layers):
            keep = [e for e in prev[layer] if rng.random() < 0.4]
            chosen = dict.fromkeys(keep)
            while len(chosen) < k:
                chosen[rng.choices(range(experts), weights)[0]] = None
            sel.append(list(chosen))
            prev[layer] = sel[-1]
        out.append(sel)
    return out


@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize("per_layer", [0.5, 1.5, 4])
def test_contract_holds_under_pressure(name: str, per_layer: float) -> None:
    layers, k = 6, 4
    capacity = max(k, int(per_layer * k * layers))
    cache = Cache(make_policy(name, capacity, layers), capacity)
    for sel in skewed_stream(60, layers, 32, k, seed=1):
        cache.token(sel)
        assert len(cache.resident) <= capacity
    assert cache.rate < 1.0  # (global LRU at 0.5 x K floods: 0 % is right there)


@pytest.mark.parametrize("name", ALL)
def test_victim_without_incoming_infers_layer_from_pinned(name: str) -> None:
    layers, k = 4, 3
    capacity = 2 * k * layers
    cache = Cache(make_policy(name, capacity, layers), capacity)
    for sel in skewed_stream(40, layers, 16, k, seed=2):
        for layer, experts in enumerate(sel):
            cache.layer(layer, experts, pass_incoming=False)
        cache.policy.step()
    assert cache.hits > 0


@pytest.mark.parametrize("name", ALL)
def test_all_pinned_raises_a_clear_error(name: str) -> None:
    policy = make_policy(name, 2, 1)
    policy.insert((0, 1))
    policy.insert((0, 2))
    with pytest.raises(NoVictimError, match="too small"):
        policy.victim({(0, 1), (0, 2)}, (0, 3))


def test_lru_evicts_least_recent_and_skips_pinned() -> None:
    lru = make_policy("lru", 3, 1)
    for e in (1, 2, 3):
        lru.insert((0, e))
    lru.hit((0, 1))
    assert lru.victim(set()) == (0, 2)
    assert lru.victim({(0, 2)}) == (0, 3)
    lru.remove((0, 2))
    assert lru.victim(set()) == (0, 3)


def test_lfu_decay_keeps_frequent_then_forgets_it() -> None:
    lfu = make_policy("lfu-decay:0.5", 2, 1)
    used(lfu, (0, 1), hits=3)
    lfu.step()
    lfu.insert((0, 2))  # newer but used once: the frequent one stays
    assert lfu.victim(set()) == (0, 2)
    for _ in range(4):  # four idle tokens halve the old count four times
        lfu.step()
    lfu.hit((0, 2))
    assert lfu.victim(set()) == (0, 1)


def test_lfu_history_survives_eviction() -> None:
    lfu = make_policy("lfu", 2, 1)
    used(lfu, (0, 1), hits=5)
    lfu.remove((0, 1))
    used(lfu, (0, 2), hits=1)
    lfu.insert((0, 1))  # comes back with its count of 7
    assert lfu.victim(set()) == (0, 2)


def test_lfu_decay_rescales_without_overflow_or_reordering() -> None:
    lfu = make_policy("lfu-decay:0.5", 4, 1)  # growth 2: rescales every ~500 tokens
    lfu.insert((0, 1))
    lfu.insert((0, 2))
    for t in range(1500):
        lfu.hit((0, 1))
        if t % 2 == 0:
            lfu.hit((0, 2))
        lfu.step()
    assert lfu.victim(set()) == (0, 2)
    assert lfu.victim({(0, 2)}) == (0, 1)


def test_arc_resists_a_one_off_scan() -> None:
    capacity = 8
    arc, lru = make_policy("arc", capacity, 1), make_policy("lru", capacity, 1)
    caches = [Cache(arc, capacity), Cache(lru, capacity)]
    hot = list(range(4))
    for rnd in range(30):
        for c in caches:
            c.layer(0, hot)
            c.layer(0, hot)  # seen twice: ARC keeps these in T2
            c.layer(0, [100 + rnd * 3, 101 + rnd * 3, 102 + rnd * 3])  # never reused
            c.layer(0, [200 + rnd * 3, 201 + rnd * 3, 202 + rnd * 3])
    assert caches[0].rate > caches[1].rate


def test_partition_does_not_flood_below_one_token_cycle() -> None:
    """Each layer reuses its experts every token; the cache holds half a cycle."""
    layers, k = 8, 4
    capacity = layers * k // 2
    tokens = [[[layer * 10 + e for e in range(k)] for layer in range(layers)]] * 30
    rates = {}
    for name in ("lru", "layer-lru", DEFAULT_POLICY):
        cache = Cache(make_policy(name, capacity, layers), capacity)
        for sel in tokens:
            cache.token(sel)
        rates[name] = cache.rate
    assert rates["lru"] == 0.0
    assert rates["layer-lru"] > 0.35
    assert rates[DEFAULT_POLICY] > 0.35


def test_partition_spills_while_not_full_then_rebalances() -> None:
    layers, capacity = 4, 8  # quota 2 per layer
    policy = make_policy("layer-lru", capacity, layers)
    cache = Cache(policy, capacity)
    cache.layer(0, [1, 2])
    cache.layer(0, [3, 4])
    cache.layer(0, [5, 6])  # layer 0 holds 6 of 8 slots: spill
    assert sum(1 for key in cache.resident if key[0] == 0) == 6
    for layer in (1, 2, 3):
        cache.layer(layer, [1, 2])  # each takes its quota back from layer 0
    assert sorted(sum(1 for key in cache.resident if key[0] == m) for m in range(4)) == [2] * 4


def test_belady_beats_every_online_policy() -> None:
    layers, k, capacity = 4, 3, 18
    stream = skewed_stream(80, layers, 24, k, seed=3)
    future = [(layer, e) for sel in stream for layer, exp in enumerate(sel) for e in exp]
    rates = {}
    for name in [*ALL, "belady"]:
        pol = BeladyPolicy(future) if name == "belady" else make_policy(name, capacity, layers)
        cache = Cache(pol, capacity)
        for sel in stream:
            cache.token(sel)
        rates[name] = cache.rate
    assert all(rates["belady"] >= r for r in rates.values())


def test_belady_rejects_a_lookup_off_its_recorded_future() -> None:
    pol = BeladyPolicy([(0, 1), (0, 2)])
    pol.insert((0, 1))
    with pytest.raises(RuntimeError, match="not the recorded future"):
        pol.insert((0, 3))


@pytest.mark.parametrize(
    ("name", "needle"),
    [("mru", "unknown cache policy 'mru'"), ("lru:0.5", "takes no parameter"),
     ("lfu-decay:x", "bad policy parameter"), ("layer-lfu:1.5", "decay must be in (0, 1]")],
)  # fmt: skip
def test_bad_names_are_one_line_errors(name: str, needle: str) -> None:
    with pytest.raises(BadValueError) as info:
        make_policy(name, 10, 2)
    msg = user_message(info.value)
    assert needle in msg and "\n" not in msg


def test_default_is_a_known_policy() -> None:
    assert DEFAULT_POLICY in POLICY_NAMES


@pytest.mark.heavy  # 5-15 s in all on a loaded machine: out of `make test-fast`
@pytest.mark.parametrize("name", ALL)
def test_operations_stay_linear_in_tokens(name: str) -> None:
    """16x the tokens must cost about 16x the CPU time, never the ~256x of a policy whose
    work per lookup grows with the tokens served (a heap never compacted, a history
    scanned on every victim). An eviction-heavy stream (2x K slots a layer, K=8 of 128
    experts), timed after the cache has filled.

    A ratio of CPU times within one process, with the bound at the geometric middle of
    linear and quadratic (64x) so that neither side is near it: linear policies measure
    13-25x here (`predict` grows while its co-occurrence rows fill: bounded by the expert
    count), and a machine under load has inflated one run over the other by 1.4x. The
    old bound, 9x for 4x the tokens, sat 1.4x above `predict`'s own 6.5x and failed
    under two suites at once (9.2x). 12 layers rather than the engine's 48: growth with
    tokens does not depend on the layer count, and fewer layers buy the wider ratio in
    less time. Speed itself is the benchmarks' job."""
    layers, k, capacity = 12, 8, 2 * 8 * 12

    def cpu_seconds(tokens: int) -> float:
        stream = skewed_stream(4 + tokens, layers, 128, k, seed=4)
        cache = Cache(make_policy(name, capacity, layers), capacity)
        for sel in stream[:4]:  # fill the cache: the timed tokens all evict
            cache.token(sel)
        t0 = time.process_time()
        for sel in stream[4:]:
            cache.token(sel)
        return time.process_time() - t0

    # Short and long alternate, so a change of load hits both sizes; the least of three
    # runs each: a run can take a preemption or a cold cache, never less time than the
    # work needs.
    runs = [(cpu_seconds(12), cpu_seconds(192)) for _ in range(3)]
    short = max(min(s for s, _ in runs), 1e-4)
    long = min(lo for _, lo in runs)
    assert long < 64 * short, f"{name}: 16x the tokens took {long / short:.1f}x"


@pytest.mark.parametrize("name", ["layer-lru", "layer-lfu"])
def test_partition_rejects_a_layer_outside_num_layers(name: str) -> None:
    policy = make_policy(name, 8, 2)
    policy.insert((1, 0))
    with pytest.raises(BadValueError, match="layer 2 is outside 0..1"):
        policy.insert((2, 0))


def test_cycle_lfu_moves_slots_to_the_layer_that_needs_them() -> None:
    """Phase A: both layers use 5 experts. Phase B: layer 0 cycles 8, layer 1 uses 2.
    A strict partition keeps layer 1's stale slots forever; cycle-lfu lets them decay."""
    capacity, layers = 10, 2
    phase_a = [
        [[(t + i) % 5 for i in range(2)], [(t + i) % 5 for i in range(2)]] for t in range(30)
    ]
    phase_b = [[[2 * t % 8, (2 * t + 1) % 8], [0, 1]] for t in range(80)]
    late = {}
    for name in ("layer-lfu", "cycle-lfu"):
        cache = Cache(make_policy(name, capacity, layers), capacity)
        for sel in phase_a + phase_b[:60]:
            cache.token(sel)
        cache.hits = cache.lookups = 0
        for sel in phase_b[60:]:
            cache.token(sel)
        late[name] = cache.rate
    assert late["cycle-lfu"] == 1.0
    assert late["layer-lfu"] < 0.9


@pytest.mark.parametrize("name", ["layer-lfu:0.5", "cycle-lfu:0.5"])
def test_partitioned_lfu_keeps_order_across_rescales(name: str) -> None:
    """decay 0.5 doubles the clock each token: ~3 rescales in 1500 tokens."""
    policy = make_policy(name, 4, 2)  # full: quota 2 per layer
    for key in [(0, 1), (0, 2), (1, 1), (1, 2)]:
        policy.insert(key)
    for t in range(1500):
        policy.hit((0, 1))
        policy.hit((1, 1))
        if t % 3 == 0:
            policy.hit((0, 2))
        policy.step()
    assert policy.victim({(1, 1), (1, 9)}, (1, 9)) == (1, 2)
    policy.remove((1, 2))
    assert policy.victim({(1, 1), (1, 9)}, (1, 9)) == (0, 2)


def _prefill_victims(name: str, frozen: bool) -> list[tuple[int, int]]:
    """The victims of ExpertCache's calls in prefill chunks and decode tokens: each layer
    looked up under its own union pinned (hits and misses interleaved), then the next
    layer's predicted union read ahead under both unions pinned; pins frozen (as the
    cache passes them) or plain sets (a policy then pushes every pinned entry back)."""
    rng = random.Random(7)
    layers, experts, capacity = 6, 32, 70  # under two layers' unions: every chunk evicts
    policy = make_policy(name, capacity, layers)
    resident: set[tuple[int, int]] = set()
    out: list[tuple[int, int]] = []
    pin = frozenset if frozen else set

    def assign(key: tuple[int, int], guard) -> None:  # noqa: ANN001
        if len(resident) >= capacity:
            v = policy.victim(guard, key)
            assert v in resident and v not in guard
            policy.remove(v)
            resident.discard(v)
            out.append(v)
        policy.insert(key)
        resident.add(key)

    for step in range(80):
        rows = 24 if step % 5 == 0 else 1  # a chunk (most of a layer), else one token
        for layer in range(layers):
            union = sorted({rng.randrange(experts) for _ in range(rows * 4)})
            keys = [(layer, e) for e in union]
            guard = pin(keys)
            for key in keys:
                if key in resident:
                    policy.hit(key)
                else:
                    assign(key, guard)
            if rows > 1 and layer + 1 < layers:
                nxt = [(layer + 1, e) for e in range(experts) if rng.random() < 0.7]
                nxt = [k for k in nxt if k not in resident]
                both = pin(set(keys) | set(nxt))
                for key in nxt:
                    assign(key, both)
        policy.step()
    return out


# decay 0.01: the clock passes 1e150 at token 75, so the scores are rescaled (heaps rebuilt)
@pytest.mark.parametrize("name", [*ALL, "lfu-decay:0.01", "layer-lfu:0.01", "cycle-lfu:0.01"])
def test_frozen_pins_choose_the_victims_plain_pins_do(name: str) -> None:
    """Under a frozenset of pins the LFU family sets pinned entries aside between victims
    instead of pushing them back (a prefill chunk's layer pins its whole union and its
    new keys are the coldest: each victim re-scanned them, 129 us a victim on the Q30
    shape); the victims must be exactly those of plain set pins, which take the old
    path, across chunks, single tokens, read-ahead and rescaled clocks."""
    frozen = _prefill_victims(name, frozen=True)
    assert len(frozen) > 500
    assert frozen == _prefill_victims(name, frozen=False)
