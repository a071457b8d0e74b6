"""Write random-weight GGUFs with the production model's exact tensor shapes and types.

    python3 bench/gpu/make_models.py OUT_DIR Q4_K_M Q4_K_S IQ4_XS [--tiny]

`--tiny` writes the same architecture at a toy size (for a dry run of the benchmark on a CPU).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import zlib
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from rag.deploy.model_shapes import QWEN36_27B, Qwen35Hparams, qwen35_model, write_gguf  # noqa: E402

TINY = Qwen35Hparams(
    n_layer=8,
    n_embd=512,
    n_ff=1536,
    n_vocab=8192,
    n_head=6,
    n_head_kv=2,
    head_dim=64,
    ssm_d_state=32,
    ssm_n_group=4,
    ssm_dt_rank=12,
    context_length=8192,
)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out", type=Path)
    parser.add_argument("quants", nargs="+")
    parser.add_argument("--tiny", action="store_true")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    shape = TINY if args.tiny else QWEN36_27B
    for quant in args.quants:
        path = args.out / f"qwen3.6-27b-shape-{quant}.gguf"
        spec = qwen35_model(shape, quant)
        if path.exists() and path.stat().st_size >= spec.tensor_bytes:
            print(json.dumps({"model": quant, "path": str(path), "cached": True}), flush=True)
            continue
        started = time.monotonic()
        part = path.with_suffix(".part")
        write_gguf(spec, part, seed=zlib.crc32(quant.encode()))
        part.rename(path)
        seconds = time.monotonic() - started
        size = path.stat().st_size
        print(
            json.dumps(
                {
                    "model": quant,
                    "path": str(path),
                    "bytes": size,
                    "seconds": round(seconds, 1),
                    "gb_per_s": round(size / seconds / 1e9, 2),
                }
            ),
            flush=True,
        )


if __name__ == "__main__":
    main()
