"""Where a run keeps its state in GCS (the contract shared with export and audit).

``RUN = <checkpoint_dir>/<run_id>``; steps under ``RUN[/<checkpoint_subdir>]/<step>/``; run state
under ``RUN/_tpu_ops/`` (a non-numeric name, so the checkpoint finder never takes it for a step).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from tpu_ops.cloud.translate import google_errors
from tpu_ops.errors import NotFoundError
from tpu_ops.uris import ObjectUri, parse_gs

STATE = "_tpu_ops"


@dataclass(frozen=True)
class RunLayout:
    """The GCS paths of one run."""

    run_uri: str
    checkpoint_subdir: str = ""

    @classmethod
    def of(cls, checkpoint_dir: str, run_id: str, checkpoint_subdir: str = "") -> RunLayout:
        return cls(str(parse_gs(checkpoint_dir).child(run_id)), checkpoint_subdir)

    @property
    def run(self) -> ObjectUri:
        return parse_gs(self.run_uri)

    @property
    def steps_uri(self) -> str:
        """The directory holding ``<step>/`` entries (the finder's ``run_uri``)."""
        return str(self.run.child(self.checkpoint_subdir)) if self.checkpoint_subdir else self.run_uri

    def state(self, relative: str) -> ObjectUri:
        return self.run.child(f"{STATE}/{relative}")

    @property
    def job(self) -> ObjectUri:
        return self.state("job.json")

    @property
    def done(self) -> ObjectUri:
        return self.state("DONE")

    @property
    def goodput(self) -> ObjectUri:
        return self.state("goodput.json")

    @property
    def run_state(self) -> ObjectUri:
        """The run's history (incarnations, preemptions, step times): the report is derived from it."""
        return self.state("state.json")

    @property
    def lease(self) -> ObjectUri:
        """Which supervisor holds the run (written with generation preconditions)."""
        return self.state("lease.json")

    @property
    def notices(self) -> ObjectUri:
        """The agents' SIGTERM notices (``notices/worker-N.json``): a preemption under way."""
        return self.state("notices")

    @property
    def agent_dir(self) -> ObjectUri:
        return self.state("agent")

    @property
    def heartbeats(self) -> ObjectUri:
        return self.state("heartbeats")

    @property
    def workers(self) -> ObjectUri:
        return self.state("workers")

    def heartbeat(self, worker: int) -> ObjectUri:
        return self.state(f"heartbeats/worker-{worker}.json")

    def worker_report(self, worker: int) -> ObjectUri:
        return self.state(f"workers/worker-{worker}.json")


def put_json(gcs: Any, uri: ObjectUri, doc: Any) -> None:
    """Write ``doc`` as JSON at ``uri``."""
    with google_errors("gcs"):
        gcs.bucket(uri.bucket).blob(uri.prefix).upload_from_string(
            json.dumps(doc, sort_keys=True, default=str), content_type="application/json"
        )


def get_json(gcs: Any, uri: ObjectUri) -> Any:
    """Read JSON at ``uri``; ``NotFoundError`` if absent."""
    with google_errors("gcs"):
        return json.loads(gcs.bucket(uri.bucket).blob(uri.prefix).download_as_bytes())


def exists(gcs: Any, uri: ObjectUri) -> bool:
    with google_errors("gcs"):
        return bool(gcs.bucket(uri.bucket).blob(uri.prefix).exists())


def list_json(gcs: Any, prefix: ObjectUri) -> list[Any]:
    """Every JSON document directly under ``prefix`` (one listing), skipping ones that vanish."""
    out = []
    with google_errors("gcs"):
        blobs = list(gcs.list_blobs(prefix.bucket, prefix=prefix.prefix + "/"))
    for blob in blobs:
        try:
            with google_errors("gcs"):
                out.append(json.loads(blob.download_as_bytes()))
        except (NotFoundError, json.JSONDecodeError):
            continue  # replaced or half-written between the listing and the read
    return out
