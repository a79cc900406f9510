"""`orchestrator calibrate --csv FILE`: measured runs this tool did not make.

The rows are made by the plan itself from known network parameters (no GPU cluster here),
so the test knows what the fit must recover; the command, the CSV parsing, the validation
and the preset it writes are the real ones."""

import csv

import pytest
import yaml

from orchestrator.run.planning import plan_trial
from orchestrator.spec import build_spec

BASE = {
    "model": "gpt2-350m",
    "hardware": "h100-sxm",
    "cluster": "slurm",
    "zero": "stage1",
    "batch.micro_batch_size": 4,
    "zero.reduce_bucket_size": 5000000,
    "logger.mode": "disabled",
}
TRUE_NETWORK = ["hardware.inter_node.busbw_gbps=40", "hardware.inter_node.latency_us=30"]


def _write(path, rows):
    with path.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return path


def _synthetic_rows():
    """A DP sweep from one node to 32 on a network slower than the preset's, as measured."""
    rows = []
    for dp in (4, 8, 16, 32, 64, 128, 256):
        point = {**BASE, "parallel.dp": dp}
        spec = build_spec([f"{k}={v}" for k, v in point.items()] + TRUE_NETWORK)
        rows.append({**point, "tokens_per_sec_per_gpu": round(plan_trial(spec).time.tokens_per_sec_per_gpu, 1)})
    return rows


@pytest.mark.slow
def test_calibrate_csv_recovers_the_network_a_dp_sweep_measured(cli, tmp_path):
    rows = _synthetic_rows()
    path = _write(tmp_path / "runs.csv", rows)
    proc = cli("calibrate", "--csv", str(path), env={"ORCHESTRATOR_USER_CONF": str(tmp_path / "conf")})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    preset = yaml.safe_load((tmp_path / "conf" / "hardware" / "h100-sxm-calibrated.yaml").read_text())
    # the preset says 368 GB/s and 9.6 us; the rows were measured at 40 GB/s and 30 us
    assert preset["inter_node"]["busbw_gbps"] == pytest.approx(40, rel=0.15)
    # A hop's latency and the fixed cost per call both cost per call: the rows cannot tell
    # them apart, so what must hold is that together they reproduce every row.
    fitted = [
        f"hardware.{k}={preset[k]}"
        for k in (
            "compute_efficiency",
            "gemm_half_dim",
            "attention_efficiency",
            "attention_backward_efficiency",
            "memory_efficiency",
            "op_overhead_us",
            "collective_overhead_us",
        )
    ]
    fitted += [
        f"hardware.{level}.{k}={preset[level][k]}"
        for level in ("intra_node", "inter_node")
        for k in ("busbw_gbps", "latency_us")
    ]
    for row in rows:
        point = {k: v for k, v in row.items() if k != "tokens_per_sec_per_gpu"}
        spec = build_spec([f"{k}={v}" for k, v in point.items()] + fitted)
        assert plan_trial(spec).time.tokens_per_sec_per_gpu == pytest.approx(row["tokens_per_sec_per_gpu"], rel=0.03)
    assert (
        preset["inter_node"]["latency_us"] + preset.get("collective_overhead_us", 0) > 20
    )  # the preset's 9.6 us is not it
    assert preset["compute_efficiency"] == pytest.approx(0.62, rel=0.05)  # the one-node rows pin the compute
    assert preset["calibrated_on"].startswith("7 trials")


@pytest.mark.parametrize(
    "column,value,says",
    [
        ("model.hiden", "1024", "model.hiden"),  # no such field
        ("parallel.dp", "0", "parallel.dp=0"),  # out of range
        ("zero", "stage9", "zero=stage9"),  # no such preset
        ("tokens_per_sec_per_gpu", "", "a measurement in every row"),
        ("tokens_per_sec_per_gpu", "fast", "a positive number"),
    ],
)
def test_a_bad_row_fails_before_fitting_naming_the_row_and_the_field(cli, tmp_path, column, value, says):
    rows = [{**BASE, "parallel.dp": 8, "tokens_per_sec_per_gpu": 1000.0} for _ in range(3)]
    rows[1][column] = value
    for row in rows:
        row.setdefault(column, "")
    path = _write(tmp_path / "runs.csv", rows)
    proc = cli("calibrate", "--csv", str(path), env={"ORCHESTRATOR_USER_CONF": str(tmp_path / "conf")})
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "runs.csv row 3" in proc.stderr and says in proc.stderr
    assert "Traceback" not in proc.stderr and not (tmp_path / "conf").exists()  # nothing fitted, nothing written


def test_a_csv_without_a_measurement_column_is_refused(cli, tmp_path):
    path = _write(tmp_path / "runs.csv", [{**BASE, "parallel.dp": 8}])
    proc = cli("calibrate", "--csv", str(path))
    assert proc.returncode == 2 and "tokens_per_sec_per_gpu" in proc.stderr


def test_a_column_named_twice_is_refused_naming_it(cli, tmp_path):
    path = tmp_path / "runs.csv"
    path.write_text("model,parallel.dp,parallel.dp,step_time_s\ngpt2-125m,8,16,1.0\n")
    proc = cli("calibrate", "--csv", str(path), env={"ORCHESTRATOR_USER_CONF": str(tmp_path / "conf")})
    assert proc.returncode == 2 and "parallel.dp is there more than once" in proc.stderr, proc.stderr
    assert not (tmp_path / "conf").exists()
