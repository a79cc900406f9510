"""One line for a trial run by `orchestrator run --out DIR`: status; speed; plan against
measured (step, MFU, allocator peak, static, activations); what nvidia-smi saw per process."""

import json
import statistics
import sys
from pathlib import Path

GIB = 2**30


def fmt(x, spec):
    return "n/a" if x is None else format(x, spec)


def ratio(a, b):
    return a / b if a and b else None


def gpu_memory(samples: str, orchestrator_pid: str, rank_pids: list) -> str:
    """Max MiB per process (nvidia-smi --query-compute-apps) and per GPU, from the sampler's lines."""
    per_pid, per_gpu = {}, {}
    try:
        lines = Path(samples).read_text().splitlines()
    except OSError:
        return "gpu-mem: no samples"
    for line in lines:
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 3:
            continue
        try:
            mib = float(parts[2])
        except ValueError:
            continue
        table = per_pid if parts[0] == "app" else per_gpu
        table[parts[1]] = max(table.get(parts[1], 0.0), mib)
    if not per_gpu:
        return "gpu-mem: nvidia-smi gave nothing"
    ranks = [per_pid.get(str(p)) for p in rank_pids]
    parent = per_pid.get(str(orchestrator_pid))
    gpus = " ".join(f"gpu{k}={v / 1024:.1f}" for k, v in sorted(per_gpu.items()))
    shown = (
        f"ranks max {max(r for r in ranks if r) / 1024:.2f} GiB"
        if any(ranks)
        else "ranks n/a (nvidia-smi lists no processes here?)"
    )
    return f"gpu-mem(nvidia-smi, GiB): {gpus}; {shown}; launching process (pid {orchestrator_pid}) " + (
        f"held {parent / 1024:.2f} GiB on the GPU during the run" if parent else "not on the GPU"
    )


def main():
    d, label = Path(sys.argv[1]), sys.argv[2]
    parent_pid = sys.argv[3] if len(sys.argv) > 3 else ""
    samples = sys.argv[4] if len(sys.argv) > 4 else ""
    rc = sys.argv[5] if len(sys.argv) > 5 else "?"
    wall = sys.argv[6] if len(sys.argv) > 6 else "?"
    res = d / "result.json"
    if not res.is_file():
        print(f"{label}: FAIL no result.json (exit {rc}, {wall} s); see {d}.log")
        return
    r = json.loads(res.read_text())
    m, p, env = r.get("metrics") or {}, r.get("plan") or {}, r.get("env") or {}
    if r["status"] != "ok":
        e = r.get("error") or {}
        msg = " ".join(str(e.get("message", "")).split())[:220]
        print(f"{label}: FAIL status={r['status']} (exit {rc}, {wall} s) {e.get('type')} rank={e.get('rank')}: {msg}")
        return
    from orchestrator.plan.prediction import planned_for_timed_steps

    hist = m["history"]
    step = m["step_time_s"]
    plan_step = planned_for_timed_steps(p, hist)["step_s"]
    pm, mm = p["memory"], m["memory"]
    plan_peak = pm["allocated"] - pm["runtime"]
    kept = 0
    try:  # FSDP2 keeps parameters across forward/backward: the census counts them as activations
        from orchestrator.plan.fsdp import kept_after_forward
        from orchestrator.plan.planner import fsdp_layout
        from orchestrator.spec import load_spec

        layout = fsdp_layout(load_spec(d))
        kept = kept_after_forward(layout) if layout else 0
    except Exception:  # noqa: BLE001
        pass
    timed = [h for h in hist if h["timed"]]
    gaps = [b["started_at"] - a["started_at"] for a, b in zip(hist, hist[1:]) if a["timed"] and b["timed"]]
    wall_over_step = (
        statistics.median(gaps) / statistics.median(h["step_time_s"] for h in timed[:-1])
        if gaps and len(timed) > 1
        else None
    )
    flags = []
    rs, rp = ratio(plan_step, step), ratio(plan_peak, mm.get("peak_bytes"))
    if rs is not None and not 0.8 <= rs <= 1.25:
        flags.append("STEP-OFF-20%")
    if rp is not None and not 0.95 <= rp <= 1.05:
        flags.append("PEAK-OFF-5%")
    if wall_over_step is not None and wall_over_step > 1.15:
        flags.append("STEP-CLOCK-MISSES-TIME")
    ranks = env.get("ranks") or []
    engine = m.get("engine") or {}
    print(
        f"{label}: PASS{(' [' + ','.join(flags) + ']') if flags else ''} ({wall} s) world={env.get('world_size')} "
        f"tok/s/GPU={m['tokens_per_sec_per_gpu']:.0f} step={step * 1e3:.1f}ms plan={plan_step * 1e3:.1f}ms "
        f"plan/meas={fmt(rs, '.2f')} noisy={bool(m.get('noisy'))} wall-between-steps/step={fmt(wall_over_step, '.2f')} "
        f"MFU={fmt(m.get('mfu'), '.3f')} (plan {fmt(p['time'].get('mfu'), '.3f')}; peak {m.get('peak_tflops')} TF: "
        f"{m.get('peak_source')}) | alloc-peak={mm['peak_bytes'] / GIB:.2f}GiB "
        f"plan-less-runtime={plan_peak / GIB:.2f}GiB "
        f"ratio={fmt(rp, '.3f')} plan-total={pm['total'] / GIB:.2f}GiB "
        f"static={fmt(ratio(pm['static'], mm.get('static_bytes')), '.3f')} "
        f"act={fmt(ratio(pm['activations'] + kept, mm.get('activation_bytes')), '.3f')} | "
        f"engine={engine.get('engine')}/{engine.get('optimizer') or engine.get('distributed_type')} "
        f"opt-plan={p['time'].get('optimizer_s', 0) * 1e3:.1f}ms ({str(p['time'].get('optimizer_source'))[:40]}) | "
        f"{str(p.get('sources', {}).get('compute'))[:90]} | "
        f"affinity(rank0)={len((env.get('affinity') or {}).get('0', []))} CPUs threads={env.get('threads_per_rank')} | "
        f"host peak rank0={fmt((ranks[0].get('host_peak_bytes') or 0) / GIB if ranks else None, '.2f')}GiB plan "
        f"{fmt((p.get('host_memory') or {}).get('per_rank', 0) / GIB, '.2f')}GiB | "
        + gpu_memory(samples, parent_pid, [x.get("pid") for x in ranks])
    )


if __name__ == "__main__":
    main()
