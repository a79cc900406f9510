"""What a planning process keeps on the GPU after make_plan has timed a new shape's kernels:
`orchestrator run` (local) plans, then waits for its ranks; the kernels are timed in a process
of their own (kernel_timing.measure_apart), so nothing should be held."""

import sys
import time

t = time.time()
from orchestrator.run.planning import plan_trial  # noqa: E402
from orchestrator.spec import build_spec  # noqa: E402

plan = plan_trial(build_spec(sys.argv[1:]))
took = time.time() - t
if "torch" not in sys.modules:
    print(f"INFO plan {took:.0f} s; every kernel was cached, torch never imported: nothing held")
    sys.exit()
import os  # noqa: E402
import subprocess  # noqa: E402

import torch  # noqa: E402

apps = subprocess.run(
    ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
    capture_output=True,
    text=True,
    timeout=30,
).stdout
mine = [line.split(",")[1].strip() for line in apps.splitlines() if line.split(",")[0].strip() == str(os.getpid())]
reserved = torch.cuda.memory_reserved() if torch.cuda.is_initialized() else 0
ok = not mine and reserved == 0
print(
    f"{'PASS' if ok else 'FAIL'} plan {took:.0f} s ({str(plan.sources['compute'])[:60]}); the planning process holds "
    f"reserved={reserved / 2**30:.2f} GiB, CUDA initialised here: {torch.cuda.is_initialized()}, nvidia-smi lists it "
    f"with {mine[0] + ' MiB' if mine else 'nothing'}; the plan's peak {plan.memory.total / 2**30:.2f} GiB of "
    f"{plan.memory.capacity / 2**30:.1f} assumes none of it"
)
