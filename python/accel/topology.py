"""Where this worker's node sits, as accel-agent tells it.

accel-agent orders node ranks so that the nodes sharing a topology path
(``--topology zone-a/rack-3/nvl-0``, a ``--topology-file``, or Slurm's
topology address) hold one run of consecutive node ranks: a *segment*. It
gives every worker the path and its segment in environment variables; this
module reads them, for building process groups by segment::

    from accel.topology import segment
    s = segment()                 # None outside accel-agent
    if s is not None:
        ranks = s.ranks(local_world_size=int(os.environ["LOCAL_WORLD_SIZE"]))
"""

import os
from dataclasses import dataclass
from typing import Mapping, Optional

__all__ = ["Segment", "segment"]


@dataclass(frozen=True)
class Segment:
    """This node's topology path and its segment in the current round."""

    path: str
    """``ACCEL_TOPOLOGY``: the path, outermost part first (empty: none given)."""
    index: int
    """``ACCEL_SEGMENT``: the segment's index among the round's, in rank order."""
    first_node: int
    """``ACCEL_SEGMENT_FIRST_NODE``: its first node rank."""
    nodes: int
    """``ACCEL_SEGMENT_NODES``: its number of nodes."""

    def ranks(self, local_world_size: int) -> range:
        """The global ranks of the segment's workers."""
        return range(self.first_node * local_world_size, (self.first_node + self.nodes) * local_world_size)


def segment(environ: Optional[Mapping[str, str]] = None) -> Optional[Segment]:
    """This node's segment from ``environ`` (default: ``os.environ``); None
    when the launcher set none (torchrun, or accel before segments)."""
    env = os.environ if environ is None else environ
    if not env.get("ACCEL_SEGMENT"):
        return None
    try:
        return Segment(
            path=env.get("ACCEL_TOPOLOGY", ""),
            index=int(env["ACCEL_SEGMENT"]),
            first_node=int(env.get("ACCEL_SEGMENT_FIRST_NODE", "0")),
            nodes=int(env["ACCEL_SEGMENT_NODES"]),
        )
    except (KeyError, ValueError) as e:
        raise ValueError(f"accel's segment variables are inconsistent: {e!r}") from None
