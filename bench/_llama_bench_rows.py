"""Tag llama-bench's JSON lines (stdin) with the build's form and the repack setting; a summary on stderr.

llama-bench ... -o jsonl | python3 bench/_llama_bench_rows.py FORM REPACK >> rows.jsonl
"""

import json
import sys

form, repack = sys.argv[1], int(sys.argv[2])
for line in sys.stdin:
    row = json.loads(line)
    row.update(form=form, repack=repack)
    print(json.dumps(row), flush=True)
    test = f"pp{row['n_prompt']}" if row["n_prompt"] else f"tg{row['n_gen']}"
    print(f"{form:8} repack={repack} t={row['n_threads']:2} {test:7} {row['avg_ts']:9.1f} tok/s", file=sys.stderr)
