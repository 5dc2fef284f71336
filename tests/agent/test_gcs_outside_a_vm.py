"""The agent's GCS client outside a VM (a trainer run by hand, the dry run's uninterrupted rerun) asks no
metadata server it was not given: against an emulator, nothing leaves loopback."""

from __future__ import annotations

import socket
from typing import Any

import pytest

from tpu_ops.agent.gcs import Gcs


def test_against_an_emulator_without_a_metadata_host_no_name_is_looked_up(monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[str] = []
    real = socket.getaddrinfo

    def record(host: Any, *a: Any, **kw: Any) -> Any:
        asked.append(str(host))
        return real(host, *a, **kw)

    monkeypatch.setattr(socket, "getaddrinfo", record)
    gcs = Gcs.from_env({"STORAGE_EMULATOR_HOST": "http://127.0.0.1:9"})
    assert gcs._token() is None
    assert asked == []  # metadata.google.internal never looked up


def test_with_a_metadata_host_the_token_is_asked_there(monkeypatch: pytest.MonkeyPatch) -> None:
    asked: list[str] = []

    def refuse(host: Any, *a: Any, **kw: Any) -> Any:
        asked.append(str(host))
        raise socket.gaierror("no network in this test")

    monkeypatch.setattr(socket, "getaddrinfo", refuse)
    gcs = Gcs.from_env({"STORAGE_EMULATOR_HOST": "http://127.0.0.1:9", "GCE_METADATA_HOST": "md.invalid:80"})
    assert gcs._token() is None  # unreachable metadata server: an emulator needs no token
    assert asked and set(asked) == {"md.invalid"}
