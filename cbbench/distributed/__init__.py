"""Load generation beyond one process: the arrival schedule is computed once, dealt to
workers (processes on this machine, or Ray actors across a cluster), started from one shared
instant, and the workers' per-request records are streamed back and merged into one result
of the same form as a one-process run. Entry point: run.run_load."""
