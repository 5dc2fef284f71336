"""The lineage of a model: dataset snapshot → training run → checkpoint → artifact → package →
approval → endpoint, assembled from the run's audit chain, its ``goodput.json`` and SageMaker.

:func:`build` is pure (records and documents in, a dict out); :func:`render` makes it text.
"""

from __future__ import annotations

from typing import Any

from tpu_ops.audit.events import AuditEvent


def _subject(record: dict[str, Any], kind: str) -> dict[str, Any]:
    return next((s for s in record.get("subjects", []) if s.get("kind") == kind), {})


def _last(records: list[dict[str, Any]], *events: str, outcome: str | None = "success") -> dict[str, Any] | None:
    r: dict[str, Any]
    for r in reversed(records):
        if r.get("event") in events and (outcome is None or r.get("outcome") == outcome):
            return r
    return None


def build(
    run_id: str,
    records: list[dict[str, Any]],
    goodput: dict[str, Any] | None = None,
    package: dict[str, Any] | None = None,
    digest: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The lineage of ``run_id`` from its chain's ``records`` (in seq order) and what else is known."""
    uploaded = _last(records, AuditEvent.MODEL_ARTIFACT_UPLOADED) or {}
    exported = _last(records, AuditEvent.MODEL_EXPORTED) or {}
    manifest = _subject(uploaded, "dataset-manifest")
    mirrored = _last(records, AuditEvent.DATASET_MIRRORED) or {}
    params = uploaded.get("params", {})
    source = _subject(uploaded, "checkpoint") or _subject(uploaded, "export-dir")
    pkg_subject = _subject(exported, "model-package")
    goodput = goodput or {}
    preempts = [_brief(r) for r in records if r.get("event") == AuditEvent.SLICE_PREEMPTED]
    recoveries = [_brief(r) for r in records if r.get("event") == AuditEvent.SLICE_RECOVERED]
    return {
        "run_id": run_id,
        "dataset": {
            # the export recorded dataset_manifest: null: the train spec named no dataset manifest
            "none_recorded": bool(uploaded) and "dataset_manifest" in params and params["dataset_manifest"] is None,
            "snapshot_id": params.get("snapshot_id") or mirrored.get("params", {}).get("snapshot_id"),
            "manifest_uri": manifest.get("uri") or mirrored.get("params", {}).get("manifest"),
            "manifest_sha256": manifest.get("sha256"),
        },
        "training": {
            "run_uri": params.get("run_uri"),
            "final_step": goodput.get("final_step"),
            "preemptions": goodput.get("preemptions") or preempts,
            "preemption_records": preempts,
            "recovery_records": recoveries,
            "goodput": {k: goodput[k] for k in ("wall_s", "productive_s", "goodput") if k in goodput},
        },
        "checkpoint": {"uri": source.get("uri"), "kind": source.get("kind"), "step": params.get("step")},
        "artifact": {k: v for k, v in _subject(uploaded, "artifact").items() if k != "kind"},
        "model_package": package or ({"arn": pkg_subject["uri"]} if pkg_subject else {}),
        "approvals": [
            {**_brief(r), "approver": r.get("params", {}).get("approver"), "reason": r.get("params", {}).get("reason")}
            for r in records
            if r.get("event") in (AuditEvent.MODEL_APPROVED, AuditEvent.MODEL_REJECTED)
            and r.get("outcome") == "success"
        ],
        "endpoints": [
            {**_brief(r), "endpoint": r.get("params", {}).get("endpoint"), "arn": _subject(r, "endpoint").get("uri")}
            for r in records
            if r.get("event") == AuditEvent.MODEL_DEPLOYED and r.get("outcome") == "success"
        ],
        "audit": {
            "chain": run_id,
            "records": len(records),
            "head": {"seq": records[-1]["seq"], "hash": records[-1]["hash"]} if records else None,
            "last_digest": {"seq": digest["seq"], "head_seq": digest["params"]["head_seq"]} if digest else None,
            "failures": [_brief(r) for r in records if r.get("outcome") in ("failure", "refused")],
        },
    }


def _brief(r: dict[str, Any]) -> dict[str, Any]:
    return {"seq": r.get("seq"), "event": r.get("event"), "time": r.get("time"), "outcome": r.get("outcome")}


def render(lin: dict[str, Any]) -> str:
    """The lineage as text, one stage per paragraph."""
    d, t, c, a, p = lin["dataset"], lin["training"], lin["checkpoint"], lin["artifact"], lin["model_package"]
    dataset = (
        "dataset           none recorded: the run's train spec had no dataset_manifest"
        if d.get("none_recorded") and not d["manifest_uri"]
        else f"dataset snapshot  {d['snapshot_id'] or '?'}  manifest {d['manifest_uri'] or '?'}"
        + (f"  sha256 {d['manifest_sha256']}" if d["manifest_sha256"] else "")
    )
    lines = [
        dataset,
        f"  → training run  {lin['run_id']}  {t['run_uri'] or ''}  final step {t['final_step']}",
        f"      preemptions: {len(t['preemptions'])}; recoveries recorded: {len(t['recovery_records'])}",
    ]
    for pre in t["preemptions"]:
        lines.append(f"        - {_one_line(pre)}")
    lines += [
        f"  → checkpoint    {c['uri'] or '?'} ({c['kind'] or '?'}, step {c['step']})",
        f"  → artifact      {a.get('uri', '?')}  sha256 {a.get('sha256', '?')}  {a.get('size', '?')} bytes",
        f"  → model package {p.get('arn', '?')}  {p.get('status', '')}",
    ]
    for ap in lin["approvals"]:
        lines.append(
            f"  → {ap['event']}  by {ap['approver']} at {ap['time']}" + (f": {ap['reason']}" if ap["reason"] else "")
        )
    if not lin["approvals"]:
        lines.append("  → approval      none yet")
    for ep in lin["endpoints"]:
        lines.append(f"  → endpoint      {ep['endpoint']} ({ep['arn']}) at {ep['time']}")
    if not lin["endpoints"]:
        lines.append("  → endpoint      not deployed")
    au = lin["audit"]
    head = au["head"] or {}
    digest = au["last_digest"] or {}
    sealed = (f"sealed by digest {digest.get('seq')} up to seq {digest.get('head_seq')}" if digest
              else "not sealed by a digest yet")  # fmt: skip
    lines.append(f"audit chain {au['chain']}: {au['records']} records, head seq {head.get('seq')} "
                 f"{str(head.get('hash', ''))[:16]}…, {sealed}")  # fmt: skip
    for f in au["failures"]:
        lines.append(f"  ! {f['event']} {f['outcome']} at {f['time']} (seq {f['seq']})")
    return "\n".join(lines)


_PREEMPTION_KEYS = ("number", "reason", "zone", "tier", "last_step", "resume_step", "steps_lost", "overhead_s")


def _one_line(obj: Any) -> str:
    if isinstance(obj, dict):
        keys = [k for k in _PREEMPTION_KEYS if k in obj] or list(obj)
        return ", ".join(f"{k}={_figure(obj[k])}" for k in keys)
    return str(obj)


def _figure(value: Any) -> str:
    """Seconds to one decimal, as the goodput report prints them; anything else as it is."""
    return f"{value:.1f}" if isinstance(value, float) else str(value)
