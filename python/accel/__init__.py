"""accel: launch distributed PyTorch training with a Rust agent.

The wheel accel-launch (``pip install .`` in a checkout of accel) puts ``accel-agent`` (torchrun's
drop-in), ``rdzv-server`` and ``accel`` (``accelerate launch``'s) on the
environment's PATH. This package adds accelerate's Python launchers::

    from accel import notebook_launcher   # instead of: from accelerate import ...
    notebook_launcher(train, args=(model,), num_processes=2)

Note: the import name ``accel`` is also used by an unrelated PyPI project
named ``accel``; install only one of the two in an environment.
"""

from .launchers import debug_launcher, notebook_launcher

__all__ = ["notebook_launcher", "debug_launcher"]

try:
    from importlib.metadata import version as _version

    __version__ = _version("accel-launch")
except Exception:  # noqa: BLE001 - running from a source tree
    __version__ = "0.0.0"
