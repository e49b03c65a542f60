"""Synthetic trace in Mooncake's format: conversations whose turns share growing hash-id
prefixes. Usage: gen_trace.py N PATH [MEAN_INPUT]."""

import json
import sys

import numpy as np

BLOCK = 512
n, path = int(sys.argv[1]), sys.argv[2]
mean_in = int(sys.argv[3]) if len(sys.argv) > 3 else 4000
rng = np.random.default_rng(7)
next_id = 0
convs: list[list[int]] = []  # each conversation's hash ids so far
t = 0.0
with open(path, "w") as f:
    for _ in range(n):
        t += float(rng.exponential(250.0))
        if convs and rng.random() < 0.6:
            c = convs[int(rng.integers(len(convs)))]
        else:
            c = []
            convs.append(c)
        length = int(rng.integers(mean_in // 2, mean_in * 3 // 2))
        blocks = -(-length // BLOCK)
        del c[min(len(c), blocks - 1):]
        while len(c) < blocks:
            c.append(next_id)
            next_id += 1
        out = int(rng.integers(50, 500))
        f.write(json.dumps({"timestamp": int(t), "input_length": length, "output_length": out,
                            "hash_ids": list(c)}) + "\n")
