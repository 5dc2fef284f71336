"""Hostile files are refused cleanly: quickly, without a traceback, naming the file and the field.

The bound in these tests is on CPU time, and generous (the machine is shared); `bench/hostile_bench.py` prints the
real figures.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import unicodedata
from pathlib import Path

import pytest

from flows.cli import main
from tpu_ops.errors import SpecError
from tpu_ops.mirror.schema import parse_schema
from tpu_ops.specs import PipelineSpec, parse_spec
from tpu_ops.specs.loader import MANIFEST_LIMITS, Limits, parse_document
from tpu_ops.text import unsafe_char

ROOT = Path(__file__).resolve().parents[2]
GOOD = (ROOT / "flows" / "dryrun.yaml").read_text()
# What a refusal may cost in CPU time, which another process's load does not inflate as it does wall time
# (3.2 s of wall once, with 3 test workers and their emulators on 2 cores); typically milliseconds.
BOUND_S = 3.0


def hostile_files() -> dict[str, tuple[bytes, str, str]]:
    """name -> (content, the field the error must name, words the error must contain)."""
    laughs = "a: &a [x,x,x,x,x,x,x,x,x]\n" + "".join(
        f"{k}: &{k} [{', '.join(['*' + p] * 9)}]\n" for p, k in zip("abcdefgh", "bcdefghi", strict=True)
    )
    cases: dict[str, tuple[str | bytes, str, str]] = {
        "billion-laughs.yaml": (laughs, "a", "anchors and aliases"),
        "alias-only.yaml": (GOOD.replace("concurrency: 8", "concurrency: *x"), "mirror.concurrency", "aliases"),
        "deep.yaml": ("a: " + "[" * 20_000 + "]" * 20_000 + "\n", "(document)", "nested more than 32"),
        "deep.json": ('{"a": ' + "[" * 20_000 + "]" * 20_000 + "}", "(document)", "nested more than 32"),
        "deep-map.yaml": ("".join(" " * i + f"k{i}:\n" for i in range(200)) + " " * 200 + "v: 1\n", "k0.", "nested"),
        "huge.yaml": ("# " + "x" * (8 << 20) + "\n", "(document)", "larger than the limit of 65536 bytes"),
        "wide.yaml": ("a: [" + ",".join(["1"] * 30_000) + "]\n", "a[", "more than the limit of 2000 values"),
        "long-number.yaml": ("name: " + "9" * 30_000 + "\n", "name", "cannot read value"),
        "duplicate-key.yaml": (GOOD + "name: other\n", "name", "appears twice"),
        "duplicate-key.json": (
            '{"name": "a", "mirror": {"source": "s3://a/b", "source": "s3://c/d"}}',
            "mirror.source",
            "appears twice",
        ),
        "python-tag.yaml": ("name: !!python/object/apply:os.system ['echo pwned']\n", "name", "tags"),
        "binary-tag.yaml": ("name: !!binary aGVsbG8=\n", "name", "tags"),
        "custom-tag.yaml": ("name: !thing x\n", "name", "tags"),
        "set-tag.yaml": ("name: !!set {a, b}\n", "name", "tags"),
        "merge-key.yaml": ("x: &x {a: 1}\ny:\n  <<: *x\n", "x", "anchors"),
        "latin-1.yaml": ("name: caf\xe9\n".encode("latin-1"), "(document)", "not UTF-8 (byte 9"),
        "utf-16.json": ('{"name": "x"}'.encode("utf-16"), "(document)", "not UTF-8"),
        "nul.yaml": ("name: a\x00b\n", "(document)", "not valid YAML"),
        "two-documents.yaml": (GOOD + "---\nname: x\n", "(document)", "more than one YAML document"),
        "complex-key.yaml": ("? [a, b]\n: c\n", "(document)", "a key must be a plain string"),
        "int-key.yaml": ("1: x\n", "(document)", "key 1 is not a string"),
        "nan.json": ('{"name": NaN}', "name", "NaN is not a finite number"),
        "inf.yaml": ("name: dry-run\nprovision: {hours: .inf}\n", "provision.hours", "Input should be a valid number"),
        "surrogate.json": ('{"name": "\\ud800"}', "name", "U+D800"),
        "bidi-name.yaml": (
            GOOD.replace("name: dry-run", "name: dry\u202erun"),
            "name",
            "U+202E RIGHT-TO-LEFT OVERRIDE",
        ),
        "zero-width-key.yaml": (
            GOOD.replace("concurrency:", "concur\u200brency:"),
            "mirror.'concur\\u200brency'",
            "U+200B ZERO WIDTH SPACE",
        ),
        "bidi-uri.yaml": (GOOD.replace("fraud/v1\n", "fraud\u2067/v1\n", 1), "mirror.source", "U+2067"),
        "bom-in-label.yaml": (
            GOOD.replace("team: dry-run", "team: dry\ufeffrun"),
            "provision.slice.labels.team",
            "U+FEFF",
        ),
        "control-in-key.yaml": (
            GOOD.replace("concurrency:", '"concurrency\\e":'),
            "mirror.'concurrency\\x1b'",
            "U+001B (a control character)",
        ),
        "line-separator.yaml": (GOOD.replace("name: dry-run", 'name: "dry\\Lrun"'), "name", "U+2028"),
    }
    return {k: (v if isinstance(v, bytes) else v.encode(), f, w) for k, (v, f, w) in cases.items()}


@pytest.mark.parametrize("name", sorted(hostile_files()))
def test_validate_refuses_each_hostile_file_quickly_naming_file_and_field(name: str, tmp_path: Path, capsys) -> None:
    content, field, words = hostile_files()[name]
    path = tmp_path / name
    path.write_bytes(content)
    t0 = time.process_time()
    code = main(["validate", "--json", str(path)])
    took = time.process_time() - t0
    out = json.loads(capsys.readouterr().out)
    assert code == 1 and out["ok"] is False and out["file"] == str(path)
    fields = [e["field"] for e in out["errors"]]
    messages = " ".join(e["message"] for e in out["errors"])
    assert any(f.startswith(field) for f in fields), (fields, messages)
    assert words in messages, messages
    assert took < BOUND_S, f"{name}: {took:.2f}s"


def test_the_console_prints_no_traceback_and_names_every_file(tmp_path: Path) -> None:
    paths = []
    for name, (content, _, _) in hostile_files().items():
        (tmp_path / name).write_bytes(content)
        paths.append(str(tmp_path / name))
    os.mkfifo(tmp_path / "fifo.yaml")  # would block a reader that opened it
    paths.append(str(tmp_path / "fifo.yaml"))
    proc = subprocess.run(
        [sys.executable, "-m", "flows.cli", "validate", *paths], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    for p in paths:
        assert f"{p}: " in proc.stderr, p
    assert "fifo.yaml: (document): not a regular file" in proc.stderr
    # one line per problem, and no invisible character reaches the terminal
    assert not any(unsafe_char(line) for line in proc.stderr.splitlines()), proc.stderr


def test_yaml_reads_plain_values_as_written() -> None:
    """YAML 1.1 surprises are off: `no` is not False, a date is not a datetime, 1:30 is not 90."""
    doc = parse_document(b"a: no\nb: 2024-01-02\nc: 1:30\nd: 0755\ne: true\nf: 12\ng: 1.5e3\nh: null\n", "t")
    assert doc == {"a": "no", "b": "2024-01-02", "c": "1:30", "d": "0755", "e": True, "f": 12, "g": 1500.0, "h": None}


def test_schema_and_manifest_files_are_read_strictly() -> None:
    with pytest.raises(SpecError, match=r"schema file s3://b/p/_schema.yaml: shards: YAML anchors"):
        parse_schema(b"version: 1\nshards: &s []\n", "s3://b/p/_schema.yaml")
    with pytest.raises(SpecError, match=r"schema file s3://b/_schema.yaml: \(document\): larger than"):
        parse_schema(b"#" * (1 << 20), "s3://b/_schema.yaml")
    with pytest.raises(SpecError, match=r"gs://b/m.json: objects: this key appears twice"):
        parse_document(b'{"objects": [], "objects": []}', "gs://b/m.json", "json", MANIFEST_LIMITS)
    with pytest.raises(SpecError, match="larger than the limit of 10 bytes"):
        parse_document(b'{"objects": []}', "gs://b/m.json", "json", Limits(max_bytes=10))


@pytest.mark.parametrize(
    ("where", "value"),
    [
        ("name", "dry\u200drun"),
        ("mirror.source", "s3://dryrun-curated/fr\u202aaud"),
        ("mirror.destination", "gs://dryrun-tpu-datasets/\u2066x"),
        ("mirror.schema_file", "_sch\u00adema.yaml"),
        ("train.hyperparameters.note", "a\u200bb"),
    ],
)
def test_format_characters_are_refused_in_names_keys_and_uris_like_control_characters(where: str, value: str) -> None:
    """Through the models too (the UI's form sends no file): the field and the character are named."""
    import yaml

    doc = yaml.safe_load(GOOD)
    *parents, leaf = where.split(".")
    node = doc
    for p in parents:
        node = node.setdefault(p, {})
    node[leaf] = value
    with pytest.raises(SpecError) as err:
        parse_spec(PipelineSpec, doc)
    field = where.removesuffix(".note")  # a hyperparameter is checked by its dict
    assert any(e["field"] == field for e in err.value.errors), err.value.errors
    assert "U+" in str(err.value) and unicodedata.name(next(c for c in value if unsafe_char(c))) in str(err.value)


def test_every_unicode_format_character_is_refused() -> None:
    refused = [c for c in map(chr, range(sys.maxunicode + 1)) if unicodedata.category(c) == "Cf"]
    assert len(refused) > 150
    assert all(unsafe_char(f"a{c}b") for c in refused)
    assert unsafe_char("caf\u00e9 \u4e2d\u6587 \U0001f600") is None  # other non-ASCII text is fine
