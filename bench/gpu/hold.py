"""Hold all but N MiB of GPU memory in this process, as a smaller card would have; report free memory on request.

    python3 bench/gpu/hold.py 16160      then send "free" or "quit" lines on stdin

A plain cudaMalloc through PyTorch (no managed memory). Prints one JSON line per event.
"""

from __future__ import annotations

import json
import sys

import torch

MIB = 1024 * 1024


def main() -> None:
    leave = int(sys.argv[1]) * MIB
    torch.cuda.init()
    free, total = torch.cuda.mem_get_info()
    held = torch.empty(max(0, free - leave), dtype=torch.uint8, device="cuda")
    torch.cuda.synchronize()
    free_now = torch.cuda.mem_get_info()[0]
    print(
        json.dumps(
            {"event": "holding", "held_mib": held.numel() / MIB, "free_mib": free_now / MIB, "total_mib": total / MIB}
        ),
        flush=True,
    )
    for line in sys.stdin:
        command = line.strip()
        if command == "free":
            print(json.dumps({"event": "free", "free_mib": torch.cuda.mem_get_info()[0] / MIB}), flush=True)
        elif command == "quit":
            break
    del held


if __name__ == "__main__":
    main()
