"""Print the policy figures `cbbench compare`'s table does not show (swap traffic, prefix-cache
hits, per-priority latency) from the result JSONs of a compare run, as Markdown.

    python results/policies/summarize.py results/runs/policies-swap/*.json
"""

import json
import sys
from pathlib import Path


def fmt(v, digits=1):
    return "-" if v is None else f"{v:,.{digits}f}"


def main(paths: list[str]) -> None:
    results = [(Path(p).stem, json.loads(Path(p).read_text())) for p in paths]
    print("| variant | preemptions | swapped out / in (blocks) | swap time (s) | prefill tokens "
          "| prefix-cache hit tokens | hit rate | busy time (s) |")
    print("|---|---|---|---|---|---|---|---|")
    for name, r in results:
        e = r["summary"]["engine"]
        rate = e["prefix_cache_hit_rate"]
        print(
            f"| {name} | {e['num_preemptions']:,} | {e['num_swapped_out_blocks']:,} / "
            f"{e['num_swapped_in_blocks']:,} | {e['swap_time_s']:.3f} | "
            f"{e['total_prefill_tokens']:,} | {e['prefix_cache_hit_tokens']:,} | "
            f"{'-' if rate is None else f'{rate:.1%}'} | {e['busy_time_s']:.2f} |"
        )
    if any("per_priority" in r["summary"] for _, r in results):
        print()
        print("| variant | priority | completed | TTFT mean / p50 / p99 (ms) "
              "| TPOT mean / p50 / p99 (ms) |")
        print("|---|---|---|---|---|")
        for name, r in results:
            for prio, c in r["summary"].get("per_priority", {}).items():
                t, p = c["ttft_ms"], c["tpot_ms"]
                print(
                    f"| {name} | {prio} | {c['completed']} | {fmt(t['mean'])} / {fmt(t['p50'])}"
                    f" / {fmt(t['p99'])} | {fmt(p['mean'], 2)} / {fmt(p['p50'], 2)} / "
                    f"{fmt(p['p99'], 2)} |"
                )


if __name__ == "__main__":
    main(sys.argv[1:])
