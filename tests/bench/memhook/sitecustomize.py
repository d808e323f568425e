"""Memory snapshots of a benchmarked process, on request (``memory_bench.py --profile``).

Put this directory on ``PYTHONPATH`` with ``BENCH_MEMHOOK=/some/prefix`` set:
``tracemalloc`` starts with the interpreter (so every allocation of the
gateway is traced, at a cost in speed), and each ``SIGUSR1`` writes
``PREFIX.N.snap`` (a ``tracemalloc`` snapshot) and ``PREFIX.N.types`` (live
objects per type, JSON), then ``PREFIX.N.done``. Nothing happens without the
variable.
"""

from __future__ import annotations

import os

_PREFIX = os.environ.get("BENCH_MEMHOOK", "")

if _PREFIX:
    import collections
    import gc
    import json
    import signal
    import tracemalloc

    tracemalloc.start(int(os.environ.get("BENCH_MEMHOOK_FRAMES", "8")))
    _count = [0]

    def _dump(signum: int, frame: object) -> None:
        _count[0] += 1
        base = f"{_PREFIX}.{_count[0]}"
        gc.collect()
        tracemalloc.take_snapshot().dump(base + ".snap")
        types = collections.Counter(type(o).__qualname__ for o in gc.get_objects())
        with open(base + ".types", "w") as f:
            json.dump(dict(types.most_common(200)), f)
        open(base + ".done", "w").close()

    signal.signal(signal.SIGUSR1, _dump)
