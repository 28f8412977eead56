"""W3 Sleep: Identity plus a 1 ms sleep per record, at a chosen parallelism.

    python jobs/sleep.py --records 4000 --parallelism 4
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import identity  # noqa: E402
from identity import main  # noqa: E402

if __name__ == "__main__":
    # identity is a sibling script, not an installed module: ship its functions by value so
    # the workers of a cluster (ray job submit) need not import it
    import ray.cloudpickle

    ray.cloudpickle.register_pickle_by_value(identity)
    main(default_map={"sleep_ms": 1.0, "records": 4000, "partitions": 8, "parallelism": 4,
                      "input_topic": "w3-in", "output_topic": "w3-out"})
