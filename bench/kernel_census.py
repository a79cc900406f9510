"""What the workload's own transformer blocks move through memory outside their GEMMs and
attention, eager: a census of every kernel one block's forward and backward dispatches.

    .venv/bin/python bench/kernel_census.py [--compiled]

A memory-bound kernel's time is its bytes over the bandwidth (plan/compute.py), so what sets
it is how many bytes the block's norms, activations, residual adds and rotary read and
write. Eager, each torch op is a kernel of its own: transformers' Llama RMSNorm upcasts to
fp32, squares, means, takes rsqrt, multiplies, downcasts and scales, seven passes over the
activation where a fused kernel makes one. The census counts, for each aten op a block's
forward and backward dispatch that is not a GEMM or attention and not a view, the bytes of
its inputs and outputs (what an elementwise or reduction kernel reads and writes once). It
is arithmetic on shapes, not a timing: the same on a CPU as on a GPU, for the same model
code and dtype. Three shapes per architecture separate what grows with the hidden width,
the MLP's width and the key/value width (bytes per token = a h + b ffn + c kv); the plan's
`EAGER_LAYER_IO` (plan/compute.py) is what this prints, and tests/unit/plan/test_compute_model.py
runs the census on a real block to hold it there.

--compiled also profiles each block eager and under torch.compile (inductor, on this CPU)
and counts the kernels that move data in each, alike: the plan's `COMPILED_KERNEL_SHARE`.
Inductor fuses a CPU's elementwise chains as it fuses a GPU's (the same scheduler), and
leaves GEMMs and attention to library calls on both; its first compile takes a minute here.
"""

from __future__ import annotations

import argparse

import numpy as np
import torch

from orchestrator.spec import build_spec
from orchestrator.workload.memory_census import tensors_in
from orchestrator.workload.model import build_model
from orchestrator.workload.torch_compat import TorchDispatchMode

GEMMS = {"mm", "addmm", "bmm", "baddbmm"}
SEQ, MICRO = 64, 2
SHAPES = ((256, 1024, 4), (256, 512, 4), (256, 1024, 1))  # (hidden, ffn, kv heads of 4)


class _Census(TorchDispatchMode):
    """Bytes each op's inputs and outputs hold, by kind, for ops that run a kernel."""

    def __init__(self):
        super().__init__()
        self.bytes = {"gemm": 0, "attention": 0, "memory": 0}
        self.kernels = {"gemm": 0, "attention": 0, "memory": 0}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if not func._schema.is_mutable and all(_is_view_of(o, args) for o in tensors_in(out)):
            return out  # a view or a metadata op: no kernel moves data
        name = func.overloadpacket.__name__
        kind = "gemm" if name in GEMMS else "attention" if "attention" in name else "memory"
        self.bytes[kind] += sum(t.numel() * t.element_size() for t in (*tensors_in(args), *tensors_in(out)))
        self.kernels[kind] += 1
        return out


def _is_view_of(t: torch.Tensor, args) -> bool:
    ptr = t.untyped_storage().data_ptr()
    return any(ptr == a.untyped_storage().data_ptr() for a in tensors_in(args))


def block_census(arch: str, hidden: int, ffn: int, kv_heads: int, dtype: torch.dtype = torch.bfloat16) -> dict:
    """{kind: bytes per token} and {kind: kernels} of one block's forward and backward."""
    overrides = [
        f"model.hidden={hidden}",
        "model.heads=4",
        f"model.ffn_hidden={ffn}",
        "model.n_layers=1",
        "model.vocab=256",
        f"model.seq_len={SEQ}",
        f"model.max_positions={SEQ}",
        "model.attention=sdpa",
    ]
    overrides += ["model=llama3-8b", f"model.kv_heads={kv_heads}"] if arch == "llama" else ["model.kv_heads=null"]
    model = build_model(build_spec(overrides).cfg.model).to(dtype)
    x = torch.randn(MICRO, SEQ, hidden, dtype=dtype, requires_grad=True)
    grad = torch.randn(MICRO, SEQ, hidden, dtype=dtype)
    if arch == "llama":
        block = model.model.layers[0]
        rotary = model.model.rotary_emb(x, torch.arange(SEQ)[None])

        def run():
            return block(x, position_embeddings=rotary, attention_mask=None)
    else:
        block = model.transformer.h[0]

        def run():
            return block(x)

    with _Census() as census:
        out = run()
        torch.autograd.backward(out[0] if isinstance(out, tuple) else out, grad)
    tokens = MICRO * SEQ
    return {"bytes": {k: v / tokens for k, v in census.bytes.items()}, "kernels": census.kernels}


def eager_io(arch: str, dtype: torch.dtype = torch.bfloat16) -> tuple[float, float, float]:
    """(a, b, c): a block's memory-bound bytes per token = a hidden + b ffn + c kv width."""
    rows, y = [], []
    for hidden, ffn, kv_heads in SHAPES:
        kv = hidden // 4 * kv_heads
        rows.append([hidden, ffn, kv if arch == "llama" else 0])
        y.append(block_census(arch, hidden, ffn, kv_heads, dtype)["bytes"]["memory"])
    solution = np.linalg.lstsq(np.array(rows, dtype=float), np.array(y), rcond=None)[0]
    return tuple(round(float(v), 2) for v in solution)  # type: ignore[return-value]


# Ops a profile shows that move no data (views, metadata, allocation): not kernels.
NO_KERNEL = {
    "aten::" + n
    for n in (
        "as_strided",
        "transpose",
        "view",
        "_unsafe_view",
        "expand",
        "resolve_conj",
        "empty",
        "empty_like",
        "empty_strided",
        "detach",
        "detach_",
        "t",
        "alias",
        "slice",
        "select",
        "unsqueeze",
        "squeeze",
        "permute",
        "reshape",
        "split",
        "chunk",
        "unbind",
        "split_with_sizes",
        "lift_fresh",
        "_reshape_alias",
        "contiguous",
        "narrow",
        "flatten",
        "unflatten",
        "view_as",
        "expand_as",
        "to",
        "type_as",
        "ones_like",
        "zeros_like",
        "new_empty",
        "new_empty_strided",
    )
}


def profiled_kernels(step) -> int:
    """Kernels one call of `step` runs: inductor's fused kernels and the innermost aten ops
    that move data (a composite op's own event is not counted beside its children)."""
    from torch.profiler import ProfilerActivity, profile

    step()  # warm: a compiled step's first call compiles
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        step()
    count = 0
    for e in prof.events():
        if "cpp_fused" in e.name:
            count += 1
        elif (
            e.name.startswith("aten::")
            and e.name not in NO_KERNEL
            and not any(c.name.startswith("aten::") and c.name not in NO_KERNEL for c in e.cpu_children)
        ):
            count += 1
    return count


def compiled_share(arch: str) -> tuple[int, int]:
    """(eager, compiled) kernels of one block's forward and backward, bf16, on this CPU."""
    import torch._inductor.config as inductor_config

    inductor_config.cpp.enable_kernel_profile = True  # each generated kernel a profiler event of its own
    hidden, ffn, kv_heads = SHAPES[0]
    overrides = [
        f"model.hidden={hidden}",
        "model.heads=4",
        f"model.ffn_hidden={ffn}",
        "model.n_layers=1",
        "model.vocab=256",
        f"model.seq_len={SEQ}",
        f"model.max_positions={SEQ}",
        "model.attention=sdpa",
    ]
    overrides += ["model=llama3-8b", f"model.kv_heads={kv_heads}"] if arch == "llama" else ["model.kv_heads=null"]
    model = build_model(build_spec(overrides).cfg.model).to(torch.bfloat16)
    x = torch.randn(MICRO, SEQ, hidden, dtype=torch.bfloat16, requires_grad=True)
    grad = torch.randn(MICRO, SEQ, hidden, dtype=torch.bfloat16)
    block = model.model.layers[0] if arch == "llama" else model.transformer.h[0]
    kwargs = (
        {"position_embeddings": model.model.rotary_emb(x, torch.arange(SEQ)[None]), "attention_mask": None}
        if arch == "llama"
        else {}
    )

    def step_of(module):
        def step():
            out = module(x, **kwargs)
            torch.autograd.backward(out[0] if isinstance(out, tuple) else out, grad)

        return step

    return profiled_kernels(step_of(block)), profiled_kernels(step_of(torch.compile(block)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--compiled", action="store_true", help="also count a compiled block's kernels")
    args = parser.parse_args()
    for arch in ("gpt2", "llama") if args.compiled else ():
        eager, compiled = compiled_share(arch)
        print(f"{arch}: a block's forward and backward runs {eager} kernels eager, {compiled} compiled")
    for arch in ("gpt2", "llama"):
        for dtype in (torch.bfloat16, torch.float32):
            census = block_census(arch, *SHAPES[0][:2], SHAPES[0][2], dtype)
            print(
                f"{arch} {str(dtype).split('.')[-1]}: bytes per token = a h + b ffn + c kv: {eager_io(arch, dtype)}; "
                f"kernels (forward + backward) {census['kernels']}"
            )


if __name__ == "__main__":
    main()
