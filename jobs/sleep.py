"""W3 Sleep: Identity plus a 1 ms sleep per record, at a chosen parallelism.

    python jobs/sleep.py --records 4000 --parallelism 4
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from identity import main  # noqa: E402

if __name__ == "__main__":
    main(default_map={"sleep_ms": 1.0, "records": 4000, "partitions": 8, "parallelism": 4,
                      "input_topic": "w3-in", "output_topic": "w3-out"})
