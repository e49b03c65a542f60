"""Write two-class.jsonl: 1,000 ShareGPT-length requests, 20% interactive (priority 0) and 80%
batch (priority 1), drawn with a fixed seed. Run from the repository root:

    python results/policies/make_two_class.py
"""

import json
from pathlib import Path

import numpy as np

from cbbench.load.workload import load_workload

SEED = 20240918
NUM_REQUESTS = 1000
INTERACTIVE_SHARE = 0.2

rng = np.random.default_rng(SEED)
pool = load_workload("sharegpt").requests
picks = rng.choice(len(pool), NUM_REQUESTS, replace=False)
lines = []
for i in picks:
    r = pool[i]
    priority = 0 if rng.random() < INTERACTIVE_SHARE else 1
    row = {"prompt_len": r.prompt_len, "output_len": r.output_len, "priority": priority}
    lines.append(json.dumps(row))
out = Path(__file__).with_name("two-class.jsonl")
out.write_text("\n".join(lines) + "\n")
print(f"wrote {out} ({len(lines)} requests)")
