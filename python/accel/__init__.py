"""accel: launch distributed PyTorch training with a Rust agent.

The wheel accel-launch (``pip install .`` in a checkout of accel) puts
``accel-agent`` (torchrun's drop-in), ``rdzv-server`` and ``accel``
(``accelerate launch``'s) on the environment's PATH. This package adds
accelerate's Python launchers, and progress reports for the agent::

    from accel import notebook_launcher   # instead of: from accelerate import ...
    notebook_launcher(train, args=(model,), num_processes=2)

    import accel
    accel.progress(step)                  # in the training loop
    accel.checkpointed(step)              # once a checkpoint is saved
    with accel.section("checkpoint"):     # work that is not a step
        save()

The launchers (and PyTorch with them) are imported on first use, so a
worker that only reports progress does not pay for them.

Note: the import name ``accel`` is also used by an unrelated PyPI project
named ``accel``; install only one of the two in an environment.
"""

from .progress import checkpointed, progress, section

__all__ = ["notebook_launcher", "debug_launcher", "progress", "checkpointed", "section"]

try:
    from importlib.metadata import version as _version

    __version__ = _version("accel-launch")
except Exception:  # noqa: BLE001 - running from a source tree
    __version__ = "0.0.0"


def __getattr__(name):
    if name in ("notebook_launcher", "debug_launcher"):
        from . import launchers

        return getattr(launchers, name)
    raise AttributeError(f"module 'accel' has no attribute {name!r}")
