"""Step time of trial B over trial A."""

import json
import sys

a, b = (json.load(open(f))["metrics"]["step_time_s"] for f in sys.argv[1:3])
print(f"{b / a:.2f} (near 1: the blocks recomputed once; 1.3 or more: recomputed twice)")
