"""The fork server's small decisions, without forking."""

from __future__ import annotations

from accel import _forkserver


def test_a_worker_names_the_agent_its_tracer_only_when_asked(monkeypatch) -> None:
    calls = []
    monkeypatch.setattr(_forkserver, "_prctl", lambda *args: calls.append(args) or 0)
    _forkserver._allow_tracer(4242)
    assert calls == [(0x59616D61, 4242, 0, 0, 0)], "PR_SET_PTRACER naming the agent"
    calls.clear()
    for absent in (None, 0, -1, "4242", True, 4.5):
        _forkserver._allow_tracer(absent)
    assert calls == [], "no tracer without a valid pid"


def test_without_prctl_nothing_is_called(monkeypatch) -> None:
    monkeypatch.setattr(_forkserver, "_prctl", False)
    _forkserver._allow_tracer(4242)  # no error
