"""The most GPU memory one pid held, from the sampler's lines (app,PID,MiB)."""

import sys

most = None
for line in open(sys.argv[1]):
    p = line.strip().split(",")
    if len(p) == 3 and p[0] == "app" and p[1] == sys.argv[2]:
        most = max(most or 0.0, float(p[2]))
print(f"{most / 1024:.2f} GiB" if most else "nothing (or nvidia-smi lists no processes here)")
