"""`orchestrator plan --json`'s figures in one line."""

import json
import sys

p = json.load(open(sys.argv[1]))
t = p["time"]
busy = [w[:70] for w in p["warnings"] if "busy" in w or "discarded" in w]
print(
    f"step {t['step_s'] * 1e3:.1f} ms (micro batch {t['micro_batch']['total_s'] * 1e3:.1f} ms, optimizer "
    f"{t['optimizer_s'] * 1e3:.1f} ms: {str(t['optimizer_source'])[:40]}), peak "
    f"{p['memory']['total'] / 2**30:.2f} GiB; "
    f"busy/discarded warnings {busy}; {str(p['sources']['compute'])[:90]}"
)
