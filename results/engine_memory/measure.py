"""Peak RSS and time to the engine's first add_request of one `cbbench run` (in-process).
Usage: measure.py run ARGS... (as cbbench's)."""

import json
import resource
import sys
import time

T0 = time.perf_counter()
from cbbench.cli.app import main  # noqa: E402
from cbbench.engine.core import engine as eng  # noqa: E402

first: dict[str, float] = {}
original = eng.Engine.add_request


def _peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def add_request(self, req):
    if not first:
        first["t"] = time.perf_counter() - T0
        first["rss_mb"] = _peak_mb()
    return original(self, req)


eng.Engine.add_request = add_request  # type: ignore[method-assign]
sys.argv = ["cbbench", *sys.argv[1:]]
try:
    main()
finally:
    print(json.dumps({"first_request_s": round(first.get("t", -1), 2),
                      "peak_rss_at_first_mb": round(first.get("rss_mb", -1)),
                      "total_s": round(time.perf_counter() - T0, 2),
                      "peak_rss_mb": round(_peak_mb())}), file=sys.stderr)
