"""Results in the formats other tools read: llm-d's Benchmark Report v0.2, CSV and Parquet.

Each writer takes a loaded result (cbbench.schema's ``read_run`` model) and returns
bytes, so the command writes every file atomically and a failed export leaves nothing behind.
"""
