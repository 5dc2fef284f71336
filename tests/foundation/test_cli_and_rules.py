"""The CLI, the settings' dry-run guard, the accelerator table and the edge rule (import rules: test_import_rules)."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

from flows.cli import build_parser, main
from tpu_ops.accelerators import ACCELERATOR_TYPES, lookup
from tpu_ops.errors import ConfigError
from tpu_ops.settings import Settings, is_loopback

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = [
    ("pipeline", ROOT / "examples" / "pipeline.yaml"),
    ("provision", ROOT / "examples" / "provision.yaml"),
    ("mirror", ROOT / "examples" / "mirror.yaml"),
    ("train-job", ROOT / "examples" / "train.yaml"),
    ("train-job", ROOT / "examples" / "maxtext.yaml"),
    ("train-job", ROOT / "examples" / "nightly-auto.yaml"),
]


@pytest.mark.parametrize(("kind", "path"), EXAMPLES, ids=[p.name for _, p in EXAMPLES])
def test_validate_accepts_shipped_examples(kind: str, path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", "--kind", kind, str(path)]) == 0
    assert "ok" in capsys.readouterr().out


def test_validate_recognises_every_example_without_kind(capsys: pytest.CaptureFixture[str]) -> None:
    """`tpu-ops validate examples/*` (a directory among them) exits 0; each example declares its kind."""
    from flows.commands.validate import declared_kind

    paths = sorted(str(p) for p in (ROOT / "examples").iterdir())
    assert main(["validate", *paths]) == 0
    out = capsys.readouterr().out
    for kind, path in EXAMPLES:
        assert declared_kind(path) == kind, f"{path.name}'s first comment line says its kind"
        assert f"{path}: ok" in out
    automation = ROOT / "examples" / "automations" / "notify-failed-retrain.yaml"
    assert declared_kind(automation) == "prefect-automation" and "Prefect automation" in out
    exe = Path(sys.executable).with_name("tpu-ops")  # as the shell expands it
    done = subprocess.run(f"{exe} validate examples/*", shell=True, cwd=ROOT, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_validate_guesses_the_kind_and_says_what_a_file_looks_like(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bare = tmp_path / "train.yaml"  # no kind comment: recognised by its keys
    bare.write_text((ROOT / "examples" / "train.yaml").read_text().split("\n", 1)[1])
    assert main(["validate", str(bare)]) == 0
    assert "train job spec" in capsys.readouterr().out
    assert main(["validate", "--kind", "pipeline", str(bare)]) == 1
    err = capsys.readouterr().err
    assert "name: Field required" in err and "look like a train-job spec: try --kind train-job" in err
    nan = tmp_path / "mirror.json"
    nan.write_text('{"source": "s3://acme-a/b", "destination": "gs://acme-b/c", "concurrency": NaN}')
    assert main(["validate", str(nan)]) == 1
    assert "concurrency: NaN is not a finite number" in capsys.readouterr().err
    odd = tmp_path / "odd.yaml"
    odd.write_text("# kind: nonsense\nfoo: 1\n")
    assert main(["validate", str(odd)]) == 1
    assert "not a tpu-ops spec I recognise (it declares kind 'nonsense'" in capsys.readouterr().err


def test_validate_rejects_unreadable_and_malformed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    broken = tmp_path / "broken.yaml"
    broken.write_text("name: [unclosed\n")
    assert main(["validate", str(broken), str(tmp_path / "missing.yaml")]) == 1
    err = capsys.readouterr().err
    assert "not valid YAML" in err and "cannot read" in err


def test_every_command_module_is_in_the_table_and_registers_its_own_name() -> None:
    import argparse
    import importlib
    import pkgutil

    import flows.commands
    from flows.cli import COMMANDS

    modules = {f"flows.commands.{m.name}" for m in pkgutil.iter_modules(flows.commands.__path__)}
    assert set(COMMANDS.values()) == {m for m in modules if not m.rsplit(".", 1)[1].startswith("_")}
    for name, module in COMMANDS.items():
        sub = argparse.ArgumentParser().add_subparsers()
        importlib.import_module(module).register(sub)
        assert list(sub.choices) == [name], f"{module} registers {list(sub.choices)}, not just {name!r}"


def test_console_script_help_for_every_subcommand() -> None:
    exe = Path(sys.executable).with_name("tpu-ops")
    assert exe.exists(), "the tpu-ops console script is installed with the package"
    top = subprocess.run([str(exe), "--help"], capture_output=True, text=True, check=True).stdout
    sub = build_parser()._subparsers._group_actions[0]  # type: ignore[union-attr]
    names = list(sub.choices)
    assert "validate" in names
    for name in names:
        assert name in top
        out = subprocess.run([str(exe), name, "--help"], capture_output=True, text=True)
        assert out.returncode == 0, f"{name} --help failed: {out.stderr}"
        assert "usage: tpu-ops" in out.stdout


def test_accelerator_table_facts() -> None:
    assert lookup("v4-32").hosts == 4 and lookup("v4-32").chips == 16 and lookup("v4-32").topology == "2x2x4"
    assert lookup("v5p-128").hosts == 16 and lookup("v5p-128").chips == 64
    assert lookup("v5litepod-16").hosts == 2
    for gen in ("v4", "v5e", "v5p", "v6e"):
        chips = {a.chips for a in ACCELERATOR_TYPES.values() if a.generation == gen}
        assert {8, 16, 32, 64, 128, 256} <= chips, gen
    for acc in ACCELERATOR_TYPES.values():
        dims = [int(d) for d in acc.topology.split("x")]
        product = 1
        for d in dims:
            product *= d
        assert product == acc.chips, acc.name
        assert acc.chips % acc.hosts == 0, acc.name
    with pytest.raises(KeyError, match="allowed"):
        lookup("v9-8")


@pytest.mark.parametrize(
    ("url", "ok"),
    [
        ("http://127.0.0.1:9000", True),
        ("127.0.0.1:4443", True),
        ("http://localhost:1", True),
        ("http://[::1]:80", True),
        ("https://storage.googleapis.com", False),
        ("http://10.0.0.5:9000", False),
        ("http://127.0.0.1.nip.io:80", False),
    ],
)
def test_loopback_detection(url: str, ok: bool) -> None:
    assert is_loopback(url) is ok


def test_dry_run_refuses_missing_and_remote_endpoints() -> None:
    local = "http://127.0.0.1:1"
    with pytest.raises(ConfigError, match="tpu_endpoint is not set"):
        Settings(dry_run=True, aws_endpoint_url=local, gcs_endpoint=local, tpu_endpoint=None).check_safe()
    with pytest.raises(ConfigError, match="not on loopback"):
        Settings(
            dry_run=True, aws_endpoint_url="https://s3.amazonaws.com", gcs_endpoint=local, tpu_endpoint=local
        ).check_safe()
    Settings(dry_run=True, aws_endpoint_url=local, gcs_endpoint=local, tpu_endpoint=local).check_safe()


def test_client_factories_fail_fast_in_dry_run() -> None:
    from tpu_ops.cloud import clients

    bad = Settings(
        dry_run=True, aws_endpoint_url=None, gcs_endpoint="https://storage.googleapis.com", tpu_endpoint=None
    )
    for factory in (clients.tpu_client, clients.storage_client, lambda s: clients.boto3_client(s, "s3")):
        with pytest.raises(ConfigError):
            factory(bad)


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module.split(".")[0])
    return found


def test_library_imports_no_prefect_flows_or_infra() -> None:
    offenders = {}
    files = sorted((ROOT / "tpu_ops").rglob("*.py"))
    assert len(files) > 5
    for path in files:
        bad = _imports(path) & {"prefect", "prefect_aws", "prefect_gcp", "flows", "infra"}
        if bad:
            offenders[str(path.relative_to(ROOT))] = sorted(bad)
    assert not offenders, f"tpu_ops must not import the edge: {offenders}"


def test_library_import_does_not_load_prefect() -> None:
    code = (
        "import sys, pkgutil, importlib, tpu_ops\n"
        "for m in pkgutil.walk_packages(tpu_ops.__path__, 'tpu_ops.'):\n"
        "    importlib.import_module(m.name)\n"
        "bad = [m for m in sys.modules if m.split('.')[0] in ('prefect', 'flows', 'infra')]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


def test_only_settings_reads_the_environment() -> None:
    # The VM agent is standard library only (no pydantic settings on a bare image): it reads the VM's
    # environment itself, in tpu_ops/agent/ alone.
    readers = [
        str(p.relative_to(ROOT))
        for p in (ROOT / "tpu_ops").rglob("*.py")
        if ("os.environ" in p.read_text() or "os.getenv" in p.read_text()) and p.name != "settings.py"
        and "agent" not in p.relative_to(ROOT / "tpu_ops").parts[:1]
    ]
    assert not readers, readers


def test_library_modules_and_functions_stay_small(tmp_path: Path) -> None:
    too_big = {str(p.relative_to(ROOT)): p.stat().st_size for p in (ROOT / "tpu_ops").rglob("*.py")}
    assert not {k: v for k, v in too_big.items() if v > 20_000}, "modules in tpu_ops/ stay under 20 KB"
    # ... and not by packing lines: measured as ruff formats them with every `# fmt: skip` taken away
    for path in (ROOT / "tpu_ops").rglob("*.py"):
        out = tmp_path / path.relative_to(ROOT)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(re.sub(r"\s*# fmt: skip$", "", path.read_text(), flags=re.M))
    ruff = Path(sys.executable).with_name("ruff")
    subprocess.run([str(ruff), "format", "-q", "--config", str(ROOT / "pyproject.toml"), str(tmp_path)], check=True)
    unpacked = {str(p.relative_to(tmp_path)): p.stat().st_size for p in tmp_path.rglob("*.py")}
    assert not {k: v for k, v in unpacked.items() if v > 20_000}, "under 20 KB without `# fmt: skip`"
    long_functions = []
    for path in (ROOT / "tpu_ops").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            is_function = isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
            if is_function and node.end_lineno and node.end_lineno - node.lineno + 1 > 60:
                long_functions.append(f"{path.relative_to(ROOT)}:{node.name}")
    assert not long_functions, f"functions over 60 lines: {long_functions}"


def test_mirror_flags_are_the_spec_fields_and_leave_defaults_to_the_spec() -> None:
    from tpu_ops.specs.jobs import MirrorSpec

    parser = build_parser("mirror")
    bare = vars(parser.parse_args(["mirror", "s3://a-b/x", "gs://c-d/y"]))
    assert {k for k in bare if k in MirrorSpec.model_fields} == {"source", "destination"}
    full = vars(parser.parse_args([
        "mirror", "s3://a-b/x", "gs://c-d/y", "--snapshot", "snap", "--concurrency", "3", "--part-size-mib", "16",
        "--ranged-min-mib", "64", "--schema-file", "s.yaml", "--require-schema",
        "--allowed-location", "eu", "--allowed-location", "US", "--engine", "auto",
    ]))  # fmt: skip
    spec = MirrorSpec.model_validate({k: v for k, v in full.items() if k in MirrorSpec.model_fields})
    assert set(spec.model_fields_set) == set(MirrorSpec.model_fields), "every field has a flag"
    assert (spec.concurrency, spec.allowed_locations, spec.require_schema) == (3, ["EU", "US"], True)
    mirror_help = parser._subparsers._group_actions[0].choices["mirror"].format_help()  # type: ignore[union-attr]
    assert f"(default: {MirrorSpec.model_fields['concurrency'].default})" in mirror_help


def test_durations_and_amounts_read_as_people_write_them() -> None:
    from tpu_ops.text import amounts_by, human_duration, usd_by

    assert [human_duration(s) for s in (1, 45.5, 90, 3600, 86400 * 7, 93600)] == ["1s", "45.5s", "1m30s", "1h", "7d",
                                                                                    "1d2h"]  # fmt: skip
    assert usd_by({"spot": 0.1074, "on-demand": 0.01}) == "on-demand $0.0100, spot $0.1074" and usd_by({}) == "-"
    assert amounts_by({"running": 0.0168}, "chip-h") == "running 0.0168 chip-h"
