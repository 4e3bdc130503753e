"""Replacing a gang's failed member: the declaration in the job body and the choice of the new host."""

from __future__ import annotations

import datetime as dt

import msgspec
import pytest

from ibpool_core.pool import allocate as al
from ibpool_core.sched.members import choose_host, replacements_due
from ibpool_core.sched.pool_cycle import LeafSource
from ibpool_core.sched.records import record_from_spec
from ibpool_proto.health import NodeFailed
from ibpool_proto.job import JobSpec
from ibpool_proto.pool import GpuAssignment, ProposePlacement, ResourceRequest
from ibpool_runtime.http import BadBody
from ibpool_scheduler.api import JobBody, spec_of

from .test_glue import T0, job, ledger_of, node

LEAF = "ibpool.io/leaf"


def gang_ledger(*extra: al.Input) -> al.Ledger:
    """Leaf A: a1 a2 a3 (a3 with 4 GPUs), leaf B: b1; a gang of 2 x 4 GPUs on a1, a2; a1 fails."""
    ledger = ledger_of(node("a1", leaf="A"), node("a2", leaf="A"), node("a3", gpus=4, leaf="A"), node("b1", leaf="B"))
    gang = ProposePlacement(
        source="s",
        key="g",
        job_id="g",
        tenant="t",
        queue="q",
        ledger_version=ledger.version,
        assignments=[GpuAssignment(node_id=n, gpu_index=i) for n in ("a1", "a2") for i in range(4)],
        on_member_failure="replace",
    )
    for cmd in (gang, NodeFailed(source="f", key="a1", node_id="a1", reason="x"), *extra):
        al.handle(ledger, cmd, T0)
    return ledger


def gang_job(**kw: object) -> object:
    return job("g", gpus=4, hosts=2, nodes=["a1", "a2"], on_member_failure="replace", state="running", **kw)


def test_the_declaration_goes_from_the_body_to_the_spec_and_the_record() -> None:
    spec = spec_of(
        msgspec.convert({"tenant": "a", "hosts": 2, "gpus_per_host": 8, "on_member_failure": "replace"}, JobBody)
    )
    assert spec.on_member_failure == "replace"
    record = record_from_spec("j", spec, T0)
    assert not isinstance(record, str) and record.on_member_failure == "replace"
    assert (
        spec_of(msgspec.convert({"tenant": "a", "hosts": 2, "gpus_per_host": 8}, JobBody)).on_member_failure
        == "restart"
    )


def test_replace_on_a_single_host_job_is_refused_with_the_path() -> None:
    with pytest.raises(BadBody) as e:
        spec_of(msgspec.convert({"tenant": "a", "gpus": 8, "on_member_failure": "replace"}, JobBody))
    assert e.value.path == "$.on_member_failure" and "multi-host" in str(e.value)
    # The same from the bus (SubmitJob): the record is refused with the reason.
    spec = JobSpec(
        name="", tenant="a", request=ResourceRequest(kind="whole", gpus_per_host=8), on_member_failure="replace"
    )
    assert record_from_spec("j", spec, T0) == (
        "on_member_failure 'replace' is for multi-host jobs (hosts >= 2); a single-host job restarts"
    )


def test_the_new_host_is_the_best_fit_under_the_members_leaf() -> None:
    ledger = gang_ledger()
    choice = choose_host(ledger, gang_job(), "a1", {}, LeafSource(LEAF))
    # a3 (4 GPUs, leaf A) is the tightest fit; b1 is in another leaf, a1 failed, a2 is a member.
    assert choice == [GpuAssignment(node_id="a3", gpu_index=i) for i in range(4)]


def test_gpus_taken_in_flight_are_not_offered() -> None:
    ledger = gang_ledger()
    choice = choose_host(ledger, gang_job(), "a1", {"a3": [0]}, LeafSource(LEAF))
    assert choice == [GpuAssignment(node_id="b1", gpu_index=i) for i in range(4)]  # preferred: any leaf next


def test_required_topology_never_leaves_the_members_leaves() -> None:
    ledger = gang_ledger()
    choice = choose_host(ledger, gang_job(topology="required"), "a1", {"a3": [0]}, LeafSource(LEAF))
    assert (
        choice
        == "no ready host outside the gang has 4 free GPUs under the leaves of its other members (topology required)"
    )


def test_no_host_fits_says_why() -> None:
    ledger = gang_ledger()
    choice = choose_host(ledger, gang_job(gpu_model="B200"), "a1", {}, LeafSource(LEAF))
    assert choice == "no ready host outside the gang has 4 free GPUs of model B200"


SITE = "ibpool.io/site"


def test_a_member_of_a_site_bound_gang_is_replaced_only_at_its_site() -> None:
    # a3 (site s1) has only 4 GPUs, enough; b1 (site s2) would fit too: the site decides.
    ledger = gang_ledger()
    for n, site in (("a2", "s1"), ("a3", "s1"), ("b1", "s2")):
        labels = {**ledger.nodes[n].labels, SITE: site}
        ledger.nodes[n] = msgspec.structs.replace(ledger.nodes[n], labels=labels)
    bound = gang_job(sites=["s1", "s2"], site="s1", topology="preferred")
    chosen = choose_host(ledger, bound, "a1", {}, LeafSource(LEAF), SITE)
    assert not isinstance(chosen, str) and {a.node_id for a in chosen} == {"a3"}
    full = choose_host(ledger, bound, "a1", {"a3": range(4)}, LeafSource(LEAF), SITE)
    assert isinstance(full, str) and "at site s1" in full


def test_sharp_stays_on_for_a_replacement_under_the_gangs_leaves_only() -> None:
    from ibpool_core.sched.members import sharp_after_replacement
    from ibpool_core.sched.records import JobPlacement

    ledger = gang_ledger()
    env = {"NCCL_COLLNET_ENABLE": "1"}
    placed = JobPlacement(ranks=["a1", "a2"], sharp=True, sharp_reason="under a SHARP leaf", nccl_env=env)
    with_sharp = gang_job(placement=placed)
    assert sharp_after_replacement(ledger, with_sharp, "a3", LeafSource(LEAF)) == placed
    off = sharp_after_replacement(ledger, with_sharp, "b1", LeafSource(LEAF))
    assert off is not None and not off.sharp and off.nccl_env == {} and "b1" in off.sharp_reason
    assert sharp_after_replacement(ledger, gang_job(), "b1", LeafSource(LEAF)) is None


@pytest.mark.parametrize(
    ("env", "path"),
    [({"A=B": "1"}, "$.workload.env.A=B"), ({"1X": "1"}, "$.workload.env.1X"), ({"X": "a\u0000b"}, "$.workload.env.X")],
)
def test_a_workload_environment_no_process_could_take_is_refused_with_the_path(env: dict[str, str], path: str) -> None:
    body = msgspec.convert({"tenant": "a", "workload": {"command": ["true"], "env": env}}, JobBody)
    with pytest.raises(BadBody) as e:
        spec_of(body)
    assert e.value.path == path
    spec = JobSpec(name="n", tenant="t", request=ResourceRequest(kind="whole", gpus_per_host=1), workload=body.workload)
    assert "environment variable" in str(record_from_spec("j", spec, T0))


def test_a_replacement_waits_for_the_controllers_backoff() -> None:
    later = T0 + dt.timedelta(seconds=30)
    marked = gang_job(replacing="a1")
    backing_off = gang_job(replacing="a1", not_before=later)
    proposed = gang_job(replacing="a1", replace_id="r1")
    queued = job("q", replacing=None)
    live = [marked, backing_off, proposed, queued]
    assert replacements_due(live, T0) == [marked]
    assert replacements_due(live, later) == [marked, backing_off]
