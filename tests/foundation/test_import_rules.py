"""The import rules, checked on grimp's graph of every import in tpu_ops, flows and infra.

Imports inside functions and under ``TYPE_CHECKING`` count too: a lazy import is still a dependency.

1. Cloud SDKs only under ``tpu_ops/cloud/``: nothing else imports ``google.*`` (google.cloud,
   google.api_core, google.auth, google.oauth2, google.rpc, google.protobuf: grimp sees the namespace
   as one external package, so the rule covers all of them), ``googleapiclient``, ``boto3`` or
   ``botocore``. ``google_crc32c`` (a checksum library, no cloud calls) is not an SDK. Two modules of
   the emulated clouds in ``infra/local`` are exempt, each for a reason given in ``SDK_EXEMPT``.
2. No upward import: ``LAYERS`` is the one statement of the layer order (grimp checks whole chains,
   so an indirect upward path fails too); within a layer, ``|`` siblings do not import each other.
3. No import cycle anywhere in tpu_ops, flows or infra.

Each rule is a function of the graph, so the last test plants one offending import per rule into
the graph and shows that the rule reports it.
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path

import grimp
import pytest

PACKAGES = ("tpu_ops", "flows", "infra")
SDKS = frozenset({"google", "googleapiclient", "boto3", "botocore"})
SDK_HOME = "tpu_ops.cloud"
SDK_EXEMPT = {
    # the emulated clouds, not the service: the stack hands tests Google's own clients on its fakes,
    # and the fake Storage Transfer Service is itself an S3 client (as the real one is)
    "infra.local.stack": "Google's own TPU/Compute clients (the stack's key) on the fakes, for tests",
    "infra.local.auth": "google-auth's own JWT-bearer grant gets the stack's token (for gcloud, raw HTTP)",
    "infra.local.sts.mover": "the fake STS reads S3 (moto) as the real service does",
}

# Highest first: a layer may import the layers below it, never one above. ``|`` separates independent
# siblings (no imports between them). The agent is the VM's standard-library-only runtime and the job
# contract the controller writes for it: it imports nothing else of tpu_ops, so it is at the bottom and
# the controller (train) may read the contract from it.
LAYERS = (
    "doctor | export",  # checks and use cases over everything below
    "train",  # a run's controller: provisioning, incarnations, checkpoints
    "run",  # one run built at the edge: its layout, clients, ledger and audit chain
    "provision | mirror | audit | runs",  # the engines
    "cloud | specs | startup",  # the SDK seam; typed specs; the VM's startup script
    "settings | polling | accelerators | layout",  # layout: the run-id rule and RUN/_tpu_ops paths
    "uris | tiers",
    "text",
    "errors | agent",
)
TOP_LAYERS = ("flows", "infra", "tpu_ops")  # flows -> infra.local (dry run) -> tpu_ops; tpu_ops imports neither


ROOT = Path(__file__).resolve().parents[2]


@functools.cache
def _graph() -> grimp.ImportGraph:
    """The graph of the source tree's packages. Under pytest ``tests/flows`` and ``tests/infra`` are on
    sys.path as namespace packages of the same names, so the real ones are looked up from ROOT first."""
    saved = {name: sys.modules.pop(name) for name in PACKAGES if name in sys.modules}
    sys.path.insert(0, str(ROOT))
    try:  # no cache_dir: grimp would write .grimp_cache into the tree
        return grimp.build_graph(*PACKAGES, include_external_packages=True, cache_dir=None)
    finally:
        sys.path.remove(str(ROOT))
        sys.modules.update(saved)


def _ours(module: str) -> bool:
    return module.split(".")[0] in PACKAGES


def sdk_importers(graph: grimp.ImportGraph) -> dict[str, set[str]]:
    """Modules outside ``tpu_ops.cloud`` (and the exempt ones) -> the SDKs they import directly."""
    out: dict[str, set[str]] = {}
    for module in graph.modules:
        if not _ours(module) or module == SDK_HOME or module.startswith(SDK_HOME + ".") or module in SDK_EXEMPT:
            continue
        found = graph.find_modules_directly_imported_by(module) & SDKS
        if found:
            out[module] = found
    return out


def upward_imports(graph: grimp.ImportGraph) -> list[str]:
    """Every import chain that goes up a layer, in tpu_ops and between the three packages."""
    tpu_ops_layers = [grimp.Layer(*(f.strip() for f in layer.split("|"))) for layer in LAYERS]
    found = graph.find_illegal_dependencies_for_layers(layers=tpu_ops_layers, containers={"tpu_ops"})
    found |= graph.find_illegal_dependencies_for_layers(layers=list(TOP_LAYERS))
    return sorted(f"{dep.importer} -> {dep.imported}: " + "; ".join(map(_route, dep.routes)) for dep in found)


def _route(route: grimp.Route) -> str:
    """``a|b -> middle -> c``: a route fans in at its head and out at its tail."""
    return " -> ".join(["|".join(sorted(route.heads)), *route.middle, "|".join(sorted(route.tails))])


def cycles(graph: grimp.ImportGraph) -> set[tuple[str, ...]]:
    """One shortest cycle through each direct import that has a way back (as a sorted module tuple)."""
    out: set[tuple[str, ...]] = set()
    for module in graph.modules:
        if not _ours(module):
            continue
        for imported in graph.find_modules_directly_imported_by(module):
            if imported == module or not _ours(imported):
                continue
            back = graph.find_shortest_chain(importer=imported, imported=module)
            if back:
                out.add(tuple(sorted(back)))
    return out


def test_every_layer_and_sdk_name_is_real() -> None:
    """A renamed package must not silently drop out of the rules."""
    graph = _graph()
    for layer in LAYERS:
        for name in layer.split("|"):
            assert f"tpu_ops.{name.strip()}" in graph.modules, name
    named = {f"tpu_ops.{n.strip()}" for layer in LAYERS for n in layer.split("|")}
    top = {m for m in graph.modules if m.count(".") == 1 and m.startswith("tpu_ops.") and m != "tpu_ops.__main__"}
    assert top <= named, f"in no layer (add them to LAYERS): {sorted(top - named)}"
    assert {"google", "botocore"} <= graph.modules, "the SDKs are seen (imported under tpu_ops.cloud)"
    assert set(SDK_EXEMPT) <= graph.modules


def test_cloud_sdks_are_imported_only_under_tpu_ops_cloud() -> None:
    offenders = sdk_importers(_graph())
    assert not offenders, f"move these SDK calls into tpu_ops/cloud/ (typed records out): {offenders}"


def test_no_upward_import() -> None:
    illegal = upward_imports(_graph())
    assert not illegal, "imports against the layer order (LAYERS in this file):\n" + "\n".join(illegal)


def test_no_import_cycle_in_tpu_ops_flows_or_infra() -> None:
    graph = _graph()
    assert graph.find_modules_directly_imported_by("tpu_ops.provision.ladder"), "the graph sees imports"
    found = cycles(graph)
    assert not found, f"import cycles: {sorted(found)[:5]}"


@pytest.mark.parametrize(
    ("rule", "importer", "imported"),
    [
        (sdk_importers, "tpu_ops.mirror.engine", "botocore"),
        (sdk_importers, "flows.pipeline", "google"),
        (sdk_importers, "infra.local.seed", "googleapiclient"),
        (upward_imports, "tpu_ops.cloud.translate", "tpu_ops.provision.ladder"),
        (upward_imports, "tpu_ops.agent.job", "tpu_ops.train.layout"),
        (upward_imports, "tpu_ops.mirror.engine", "tpu_ops.audit.trail"),  # independent siblings
        (upward_imports, "tpu_ops.settings", "infra.local.stack"),
        (cycles, "infra.local.seed", "infra.local.stack"),  # the cycle there was before
        (cycles, "flows.cli", "flows.commands.validate"),
    ],
)
def test_each_rule_reports_a_planted_import(rule: object, importer: str, imported: str) -> None:
    graph = _graph()
    assert callable(rule)
    assert not rule(graph)
    planted = [(importer, imported)]
    if rule is cycles and not graph.find_shortest_chain(importer=imported, imported=importer):
        planted.append((imported, importer))  # close the loop
    try:
        for a, b in planted:
            graph.add_import(importer=a, imported=b)
        assert rule(graph), f"{rule.__name__} misses {importer} -> {imported}"
    finally:  # the graph is shared with the other tests of this module
        for a, b in planted:
            graph.remove_import(importer=a, imported=b)
    assert not rule(graph)
