"""The prefix-aware router: it sends a request to the replica whose prefix cache holds its
leading blocks (the engine's own hashes), within a load-imbalance limit.

Truth: the engines' own prefix-cache counters (num_cached_tokens over the tokens looked up),
summed over the replicas, for the same requests and arrivals under each router.
"""

from __future__ import annotations

import pytest
from helpers import run_spec

from cbbench.bench.runner import execute_run
from cbbench.engine.args import EngineArgs, EngineArgsError
from cbbench.engine.build import build_replicas
from cbbench.engine.core.request import Request
from cbbench.engine.sim.router import PrefixAwareRouter
from cbbench.schema.run import Summary


class _Replica:
    def __init__(self, load: int, hits: int) -> None:
        self.num_unfinished = load
        self.kv_usage = 0.0
        self.hits = hits

    def prefix_hit_blocks(self, req) -> int:
        return self.hits


def test_prefers_the_cached_replica_within_the_imbalance_limit():
    req = Request(0, 64, 4)
    router = PrefixAwareRouter(max_imbalance=4)
    # Replica 2 holds 3 blocks and is 4 requests above the least loaded: it wins.
    assert router.choose([_Replica(1, 0), _Replica(2, 1), _Replica(5, 3)], req) == 2
    # 5 above: beyond the limit, the best cache among the others wins.
    assert router.choose([_Replica(1, 0), _Replica(2, 1), _Replica(6, 3)], req) == 1
    # No hit anywhere: the least loaded, ties to the lowest index.
    assert router.choose([_Replica(3, 0), _Replica(2, 0), _Replica(2, 0)], req) == 1


def test_lookup_uses_the_engines_hashes():
    """A request whose prompt a replica has finished is found there, block for block."""
    args = EngineArgs(engine="sim", model="llama-3.2-1b", data_parallel_size=2,
                      router="prefix-aware", enable_prefix_caching=True, num_kv_blocks=64,
                      max_model_len=1024)
    replicas, _ = build_replicas(args)
    prompt = list(range(100))
    first = Request(0, 100, 2, prompt_token_ids=prompt)
    replicas.replicas[1].engine.add_request(first)
    while replicas.replicas[1].engine.has_unfinished():
        replicas.replicas[1].engine.step()
    again = Request(1, 100, 2, prompt_token_ids=prompt)
    assert [r.prefix_hit_blocks(again) for r in replicas.replicas] == [0, 6]  # 96 of 100
    assert replicas.router.choose(replicas.replicas, again) == 1


def test_needs_prefix_caching():
    with pytest.raises(EngineArgsError, match="--enable-prefix-caching"):
        build_replicas(EngineArgs(engine="sim", data_parallel_size=2, router="prefix-aware"))


def _multiturn(router: str) -> Summary:
    spec = run_spec(workload="sharegpt-multiturn", num_requests=60, request_rate=4.0,
                   seed=0,
                   engine=EngineArgs(engine="sim", model="llama-3-8b", data_parallel_size=4,
                                     router=router, enable_prefix_caching=True))
    return execute_run(spec).summary


def test_hit_rate_beats_least_requests_on_multiturn_dp4():
    """Each turn resends the conversation so far: its leading blocks sit in the cache of the
    replica that served the previous turn. least-requests scatters the turns over 4 replicas
    (about 1 in 4 lands where its history is); prefix-aware follows the history."""
    least, prefix = _multiturn("least-requests"), _multiturn("prefix-aware")
    assert least.completed == prefix.completed > 0
    lr, pa = least.engine.prefix_cache_hit_rate, prefix.engine.prefix_cache_hit_rate
    assert pa > lr + 0.2, (pa, lr)
    # The tokens not recomputed show in the time to first token.
    assert prefix.ttft_ms.mean < least.ttft_ms.mean
