"""How long the API's key check takes for a right scoped key, a wrong secret of a real key id, an unknown
id, a malformed token and a wrong admin key: the refusals should not tell a wrong secret from an unknown
key by their time (the check compares hashes in constant time, against a stand-in for an unknown id).

The check is `rag.api.access.authorize` in this process, over a key file of 100 keys; the cases are
interleaved in a shuffled order so that drift of the machine's load falls on all of them alike.

    PYTHONPATH=. nice .venv/bin/python bench/key_timing.py [--rounds 20000]

Results: bench/results/key_timing.json.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench._provenance import header, write_json  # noqa: E402 (after the path set-up above)
from rag.api.access import authorize  # noqa: E402 (after the path set-up above)
from rag.core.config import Settings  # noqa: E402 (after the path set-up above)
from rag.core.errors import Unauthorized  # noqa: E402 (after the path set-up above)
from rag.store.keys import FILE, KeyStore  # noqa: E402 (after the path set-up above)

RESULTS = ROOT / "bench" / "results"
ADMIN = "an-admin-key-of-some-length-0123456789"


def cases(tokens: list[str]) -> dict[str, str]:
    token = tokens[50]
    key_id, secret = token.split("_")[1], token.split("_", 2)[2]
    wrong = ("A" if secret[0] != "A" else "B") + secret[1:]
    unknown = next(f"{n:08x}" for n in range(1 << 32) if f"{n:08x}" not in {t.split("_")[1] for t in tokens})
    return {
        "right scoped key": f"Bearer {token}",
        "wrong secret, real id": f"Bearer rag_{key_id}_{wrong}",
        "unknown id": f"Bearer rag_{unknown}_{secret}",
        "malformed token": f"Bearer {secret}",
        "wrong admin key": f"Bearer {ADMIN[:-1]}x",
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=20000)
    args = parser.parse_args()
    print(header(), flush=True)
    with tempfile.TemporaryDirectory(prefix="rag-key-timing-") as tmp:
        settings = Settings(data_dir=Path(tmp), api_key=ADMIN)
        keys = KeyStore(Path(tmp) / FILE)
        tokens = [keys.create([f"c{i:03d}"], read_only=True)[1] for i in range(100)]
        headers = cases(tokens)
        order = [name for name in headers for _ in range(args.rounds)]
        random.Random(3).shuffle(order)
        times: dict[str, list[float]] = {name: [] for name in headers}
        for name in order:
            started = time.perf_counter_ns()
            try:
                authorize(headers[name], settings, keys)
            except Unauthorized:
                pass
            times[name].append((time.perf_counter_ns() - started) / 1000)
        keys.close()
    load = [round(x, 2) for x in os.getloadavg()]
    rows = {}
    for name, values in times.items():
        values.sort()
        rows[name] = {
            "median_us": round(statistics.median(values), 2),
            "p95_us": round(values[int(len(values) * 0.95)], 2),
            "mean_us": round(statistics.fmean(values), 2),
        }
        print(f"{name:<24} median {rows[name]['median_us']:7.2f} us  p95 {rows[name]['p95_us']:7.2f} us", flush=True)
    print(f"{args.rounds:,} checks of each; load average {load}", flush=True)
    write_json(RESULTS / "key_timing.json", {"rounds": args.rounds, "cases": rows, "load_average": load})


if __name__ == "__main__":
    main()
