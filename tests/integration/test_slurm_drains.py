"""The Slurm bridge's decision against a real Slurm: slurmctld and three slurmd (Debian's 22.05), the
actions of `ibpool_core.slurm_bridge.sync` carried out with scontrol and Slurm's view read back with
`scontrol show node --details --oneliner` each round, as the bridge does."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from ibpool_core.slurm_bridge import SlurmNode, SyncReply, SyncRequest, parse_scontrol_nodes, sync
from ibpool_runtime import slurmstack
from tests.integration.slurm_support import munge_socket

__all__ = ["munge_socket"]

pytestmark = pytest.mark.integration

NODES = ["n1", "n2", "n3"]


def view(slurm: slurmstack.Cluster) -> dict[str, SlurmNode]:
    return parse_scontrol_nodes(slurm.scontrol("show", "node", "--details", "--oneliner"))


def round_(slurm: slurmstack.Cluster, wanted: dict[str, str]) -> SyncReply:
    """One round of the bridge: read Slurm, decide, carry the actions out."""
    reply = sync(SyncRequest(wanted=wanted, slurm=view(slurm)))
    for action in reply.actions:
        slurm.scontrol(*action.scontrol())
    return reply


def test_ibpool_drains_and_resumes_only_its_own_and_a_second_round_changes_nothing(
    munge_socket: Path, tmp_path: Path
) -> None:
    with slurmstack.cluster(tmp_path / "slurm", munge_socket, NODES, slurmd=NODES) as slurm:
        deadline = time.monotonic() + 30
        while not all("IDLE" in n.state for n in view(slurm).values()):
            assert time.monotonic() < deadline, view(slurm)
            time.sleep(0.2)
        slurm.scontrol("update", "NodeName=n3", "State=DRAIN", "Reason=bad DIMM, ticket 4711")  # an operator's

        wanted = {"n1": "ibpool: node: heartbeats lost for 3.1 s", "n3": "ibpool: gpu 0: XID 48"}
        first = round_(slurm, wanted)
        assert [(type(a).__name__, a.node) for a in first.actions] == [("Drain", "n1")]
        nodes = view(slurm)
        assert nodes["n1"].drained and nodes["n1"].reason == "ibpool: node: heartbeats lost for 3.1 s"
        assert nodes["n3"].reason == "bad DIMM, ticket 4711"  # not drained over
        assert round_(slurm, wanted).actions == []  # what Slurm shows is what ibpool wants

        # the verdicts clear: ibpool resumes its own drain, never the operator's
        last = round_(slurm, {})
        assert [(type(a).__name__, a.node) for a in last.actions] == [("Resume", "n1")]
        nodes = view(slurm)
        assert not nodes["n1"].drained and "IDLE" in nodes["n1"].state
        assert nodes["n3"].drained and nodes["n3"].reason == "bad DIMM, ticket 4711"
        assert round_(slurm, {}).actions == []
