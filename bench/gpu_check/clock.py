"""kernel_timing's two GPU clocks on one big and one tiny GEMM, and its quiet check on an idle GPU."""

import time

import torch

from orchestrator.core.errors import KernelTimingError
from orchestrator.measure.kernel_clock import clock
from orchestrator.measure.kernel_timing import QuietCheck

dev, ev = clock("cuda"), clock("cuda", whole=True)
a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
b = torch.randn_like(a)
s = torch.randn(64, 64, device="cuda", dtype=torch.bfloat16)
big_dev, big_ev = dev(lambda: a @ b, 10, 3), ev(lambda: a @ b, 10, 3)
small_dev, small_ev = dev(lambda: s @ s, 10, 3), ev(lambda: s @ s, 10, 3)
flops = 2 * 4096**3
# The quiet check as a plan meets it: its first probe on a GPU that sat idle (clocks down),
# its second after a second of work (clocks up). A ratio past 1.25 says "busy": nothing cached.
torch.cuda.synchronize()
time.sleep(5)
q = QuietCheck(dev, "cuda")
try:
    q.first(lambda: None)
    until = time.time() + 1.0
    while time.time() < until:
        a @ b
    torch.cuda.synchronize()
    verdict = q.verdict() or "quiet"
except KernelTimingError as exc:  # CUPTI saw no kernel: the plan falls back to the preset and says so
    verdict = f"KernelTimingError: {exc}"
ok = big_dev > 0 and small_dev > 0 and verdict == "quiet"
print(
    f"{'PASS' if ok else 'FAIL'} 4096^3 bf16 GEMM {flops / big_dev / 1e12 if big_dev else 0:.0f} TFLOP/s by "
    "CUPTI device "
    f"time, {flops / big_ev / 1e12:.0f} by CUDA events; 64^3: {small_dev * 1e6:.1f} us device vs "
    f"{small_ev * 1e6:.1f} us "
    f"events (host pace); quiet check on an idle GPU: {verdict[:120]}"
)
