"""Secrets planted in every place a user can type one never leave the process: not in a
file a trial, a sweep, a tune or a SLURM translate writes (W&B's run files included), not
on the terminal. Each test greps everything written and printed for the planted values."""

from pathlib import Path

import pytest

from orchestrator.core.errors import ConfigError
from orchestrator.core.redact import MASK, RedactedOutput, redact, redact_text, secret_exports
from tests.conftest import FP32, PRESET_KERNELS, run_cli

SPELLINGS = {  # the value after each spelling is the secret
    "PGPASSWORD=s3cretpg": "s3cretpg",
    "MYAPIKEY=s3cretapikey": "s3cretapikey",
    "GH_PAT=ghp_s3cretpat": "ghp_s3cretpat",
    "curl -H 'Authorization: Bearer s3cretbearer'": "s3cretbearer",
    "git clone https://me:s3cretpw@example.com/r.git": "s3cretpw",
    "huggingface-cli login --token hf_s3cretflag": "hf_s3cretflag",
    "--api-key=s3cretdash": "s3cretdash",
    "db.password: s3cretcolon": "s3cretcolon",
    # nested: inside a value whose own name is not secret, and a URL password holding '/'
    "logger.group=https://x.com/hook?api_key=s3cretquery&a=b": "s3cretquery",
    "logger.tags=['s3://ak:s3cret/slash@host/bucket']": "s3cret/slash",
    "export DATABASE_URL=postgres://u:s3cretdb@db/x": "s3cretdb",
    "--url https://me:s3cretflagurl@example.com": "s3cretflagurl",
    "{'api_key': 's3cretdict', 'steps': 3}": "s3cretdict",
    "git clone https://ghp_s3cretusertoken1234@github.com/r": "ghp_s3cretusertoken1234",
    # no name at all: the token's own format says what it is
    "logger.tags=['ghp_s3cretBareGithubToken0123']": "ghp_s3cretBareGithubToken0123",
    "aws s3 ls --profile x AKIAS3CRETS3CRETS3CR": "AKIAS3CRETS3CRETS3CR",
}


def leaks(directory: Path, *secrets: str) -> list[str]:
    """Every file below `directory` holding one of `secrets`, with the secret found."""
    found = []
    for path in directory.rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            found += [f"{path}: {s}" for s in secrets if s.encode() in data]
    return found


@pytest.mark.parametrize("text", list(SPELLINGS))
def test_each_common_spelling_of_a_secret_is_masked_and_its_name_kept(text):
    out = redact_text(text)
    assert SPELLINGS[text] not in out and MASK in out
    assert out.split()[0][:4] == text.split()[0][:4]  # the name (or command) stays readable


def test_ordinary_names_and_values_are_left_alone():
    for text in (
        "tokens_per_sec_per_gpu=3000",
        "ramp_tokens: 5",
        "PWD=/home/me",
        "model.hidden=64",
        "monkey=1",
        "keyboard=us",
        "a basic setup",
        "https://example.com/path",
        "http://host:8080/path",
        "ssh://git@github.com/r",
        "logger.group=https://x.com/a?b=c&d=e",
        "ConfigKeyError: 'str' object",
        "KeyError: 'model'",
        "model_per_token: 1.2e6",
        "pip install sk-learn hf_hub",
        "git checkout 0123456789abcdef0123456789abcdef01234567",
    ):
        assert redact_text(text) == text


def test_a_flag_and_its_value_as_separate_list_items_are_masked():
    assert redact(["--token", "abc", "--nodes", "2", "--api-key=x"]) == [
        "--token",
        MASK,
        "--nodes",
        "2",
        "--api-key=" + MASK,
    ]


def test_a_config_error_never_shows_the_secret_value():
    assert "abc123" not in str(ConfigError("logger.api_key", "abc123", "a key"))
    assert "abc123" not in str(ConfigError("cluster.setup", "export HF_TOKEN=abc123", "a line"))


def test_printed_output_is_masked_even_when_a_line_arrives_in_pieces(capsys):
    import sys

    stream = RedactedOutput(sys.stdout)
    for piece in ("export HF_", "TOKEN=abc", "123\nnext line\n", "GH_PAT=zz9"):
        stream.write(piece)
    stream.flush()
    out = capsys.readouterr().out
    assert "abc123" not in out and "zz9" not in out and "next line" in out and out.count(MASK) == 2


@pytest.mark.slow
def test_a_sweep_with_secrets_in_values_tags_and_setup_writes_and_prints_none(cli, tmp_path):
    swept = ["s3cretsweep1", "s3cretsweep2"]
    setup = ",".join(f"['export A_PASSWORD={s}','export PGPASSWORD=s3cretpg']" for s in swept)
    proc = run_cli(
        "run",
        "-m",
        "model=tiny",
        PRESET_KERNELS,
        FP32,
        "run.steps=2",
        "run.warmup_steps=1",
        f"cluster.setup={setup}",
        "logger.tags=['token=s3crettag','s3://ak:s3cret/tagslash@h/b']",
        "logger.group='https://x.com/hook?api_key=s3cretgroup&a=b'",
        "logger.mode=offline",
        "--out",
        str(tmp_path),
        timeout=600,
    )
    said = proc.stdout + proc.stderr
    assert proc.returncode == 0, said
    planted = [*swept, "s3cretpg", "s3crettag", "s3cret/tagslash", "s3cretgroup"]
    assert not leaks(tmp_path, *planted) and not [s for s in planted if s in said]
    assert list(tmp_path.glob("*/wandb/offline-run-*/run-*.wandb"))  # W&B's own file was written, and searched
    assert all("A_PASSWORD=***" in p.read_text() for p in tmp_path.glob("*/config.yaml"))  # masked, name kept
    # --cfg job (Hydra prints the config) and an error paragraph are masked too
    proc = cli("plan", "cluster.setup=['export HF_TOKEN=s3cretcfg']", "--cfg", "job")
    assert proc.returncode == 0 and "s3cretcfg" not in proc.stdout + proc.stderr and "HF_TOKEN=***" in proc.stdout
    proc = cli("plan", "logger.tags=['token=s3cretlong" + "x" * 80 + "']")
    assert proc.returncode == 2 and "s3cretlong" not in proc.stdout + proc.stderr


def test_a_slurm_translate_keeps_exports_out_of_its_files_and_refuses_secrets_it_would_write(cli, tmp_path):
    base = ["translate", "cluster=slurm", "hardware=cpu"]
    # an export carries a secret in its name or anywhere in its value: the documented way, taken
    setup = "cluster.setup=['module load cuda','export HF_TOKEN=s3cretexport','export DB_URL=pg://u:s3cretdb@h/x']"
    proc = run_cli(*base, setup, "--out", str(tmp_path / "ok"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert not leaks(tmp_path, "s3cretexport", "s3cretdb") and "s3cret" not in proc.stdout + proc.stderr
    script = (tmp_path / "ok" / "launch.sh").read_text()
    assert "module load cuda" in script and "# export DB_URL=***" in script
    assert secret_exports(["export DB_URL=pg://u:s3cretdb@h/x", "export OMP_NUM_THREADS=4"]) == (
        ["# export DB_URL=***  (not written to files: set in sbatch's environment)", "export OMP_NUM_THREADS=4"],
        {"DB_URL": "pg://u:s3cretdb@h/x"},
    )
    # a local trial writes no job script: nothing to refuse, and nothing about sbatch
    proc = cli("plan", "cluster=local", "cluster.setup=['huggingface-cli login --token s3cretlocal']")
    assert proc.returncode == 0 and "s3cretlocal" not in proc.stdout + proc.stderr
    # Anywhere else the value would be written in clear (the job script, squeue's comment)
    for override in (
        "cluster.setup=['huggingface-cli login --token s3cretsetup']",
        "cluster.srun_args=['--token','s3cretsrun']",
        "cluster.comment='password=s3cretcomment'",
        "+cluster.additional_parameters.my_token=s3cretparam",
        "cluster.setup=['git clone https://me:s3creturl@example.com/r']",
    ):
        proc = cli(*base, override, "--out", str(tmp_path / "refused"))
        field = override.lstrip("+").split("=")[0]
        assert proc.returncode == 2 and field in proc.stderr and "Traceback" not in proc.stderr, override
        assert "s3cret" not in proc.stdout + proc.stderr and not (tmp_path / "refused").exists(), override


@pytest.mark.parametrize(
    "text,secret",
    [
        ("Driver=x;Server=db;Uid=me;pwd=hunter2;", "hunter2"),
        ("passphrase=correct-horse", "correct-horse"),
        ("DB_PASS=s3cr3t", "s3cr3t"),
        ("session_id=0badc0ffee", "0badc0ffee"),
        ("Cookie: sid=abc123def", "abc123def"),
        ("https://acct.blob.core.windows.net/c/f?sv=2022&sig=AzureSig123%3D", "AzureSig123"),
        ("https://b.s3.amazonaws.com/o?X-Amz-Signature=deadbeef42&X-Amz-Date=1", "deadbeef42"),
        ("Authorization: token ghabc1234567890", "ghabc1234567890"),
        ("Authorization: ApiKey k3y-value", "k3y-value"),
        ('Authorization: Digest username="u", response="6629fae49393a05397450978507c4ef1"', "6629fae4"),
        ("Authorization: AWS4-HMAC-SHA256 Credential=AKID/2026, Signature=fe5f80f77d5fa3be", "fe5f80f77d5f"),
        ("password=first,second", "second"),
        ("password=[one,two]", "two"),
        ("api_key=$ecret!value", "ecret!value"),
        ("password=$ecret", "ecret"),  # a lower-case `$name` is no environment variable's
        ("https://user:p@ss@db.example.com/x", "p@ss"),
        ("https://hooks.slack.com/services/T0001/B0001/XXXXXXXXXXXXXXXX", "XXXXXXXXXXXXXXXX"),
        ("eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.SflKxwRJSMeKKF2QT4fwpMeJf36POk6yJV_adQssw5c", "SflKxwRJ"),
        ("glpat-abcdefghijklmnopqrstu", "abcdefghijklmnop"),
        ("npm_abcdefghijklmnopqrstuvwxyz0123456789", "abcdefghijklmnop"),
    ],
)
def test_secrets_the_last_pass_found_in_other_spellings_are_masked(text, secret):
    assert secret not in redact_text(text), redact_text(text)


@pytest.mark.parametrize(
    "text,secret",
    [  # formats only detect-secrets' detectors know (redact._DETECTORS)
        ("stripe sk_live_4eC39HqLyjWDarjtT1zdp7dc", "4eC39HqLyjWDarjtT1zdp7dc"),
        ("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", "TwL2iGABf9DHoTf"),
        ("twilio SK0123456789abcdef0123456789abcdef", "0123456789abcdef0123456789abcdef"),
        ("MTIzNDU2Nzg5MDEyMzQ1Njc4.GhIjKl.abcdefghijklmnopqrstuvwxyz0", "abcdefghijklmnopqrstuvwxyz0"),
        (
            "pypi-AgEIcHlwaS5vcmcCJDAwMDAwMDAwLTAwMDAtMDAwMC0wMDAwLTAwMDAwMDAwMDAwMAACJXsicGVybWlzc2lvbnMiOiAidXNlciJ9AAAGIA",
            "cHlwaS5vcmcCJDAw",
        ),
        (
            "DefaultEndpointsProtocol=https;AccountName=x;AccountKey="
            + "a1B2" * 21
            + "ab==;EndpointSuffix=core.windows.net",
            "a1B2a1B2a1B2",
        ),
        ("chimp 0123456789abcdef0123456789abcdef-us12", "0123456789abcdef0123456789abcdef"),
    ],
)
def test_credentials_a_maintained_detector_knows_by_their_format_are_masked(text, secret):
    assert secret not in redact_text(text), redact_text(text)


def test_what_looks_random_but_is_no_credential_stays():
    """The detectors left out would mask these (entropy, public IPs): a run id, a directory's
    hash, a node's address, a sweep's override, a plan's figures."""
    for text in (
        "wandb/offline-run-20261202_101500-1a2b3c4d",
        "3_parallel.dp=2,zero.reduce_bucket_size=5e8-9f8e7d6c",
        "node 203.0.113.7:29500",
        "hydra.sweep.dir=sweeps/2026-12-02/10-15-00",
        "step 0.412 s, 20,463 tokens/s",
    ):
        assert redact_text(text) == text


def test_a_variable_that_names_a_secret_stays_and_a_literal_dollar_value_is_masked():
    for text in ("password=$TOKEN", "password=${TOKEN}", "token=$(cat ~/.t)"):
        assert redact_text(text) == text


def test_the_plans_own_text_reaches_no_file_unmasked(cli, tmp_path):
    """A link's name, a user-given string the plan repeats in its assumptions, is masked in
    plan.json like every other file (the plan's text went out as it was)."""
    proc = cli(
        "translate",
        "hardware=h100-sxm",
        "hardware.inter_node.name='ib token: abc123secret'",
        "parallel.dp=16",
        "cluster=slurm",
        "cluster.gpus_per_node=8",
        "--out",
        str(tmp_path / "t"),
    )
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "t" / "plan.json").is_file()
    assert [p.name for p in (tmp_path / "t").rglob("*") if p.is_file() and b"abc123secret" in p.read_bytes()] == []
    assert "abc123secret" not in proc.stdout + proc.stderr
