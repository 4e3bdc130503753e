"""Multi-site in the service's cycle (no bus, no database): a job naming sites is bound to the one
where it is estimated to start first, data locality counted, and placed only on that site's hosts."""

from __future__ import annotations

import datetime as dt

import msgspec

from ibpool_core.sched.cycle import CycleConfig
from ibpool_core.sched.pool_cycle import PlacementInputs, plan_cycle
from ibpool_core.sched.queueing import make_policy
from ibpool_core.sched.records import JobRecord, record_from_spec
from ibpool_proto.job import JobSpec
from ibpool_proto.pool import GpuAssignment, ResourceRequest

from .test_glue import T0, job, ledger_of, node
from .test_placement_and_queues import framework, hosts_of


def at_site(node_id: str, site: str, gpus: int = 8) -> object:
    registered = node(node_id, gpus)
    return msgspec.structs.replace(registered, labels={**registered.labels, "ibpool.io/site": site})


def cycle(ledger: object, live: list[JobRecord], **inputs: object):  # type: ignore[no-untyped-def]
    placement = PlacementInputs(framework(), site_transfer_s=3600.0, **inputs)  # type: ignore[arg-type]
    return plan_cycle(
        ledger,  # type: ignore[arg-type]
        live,
        T0 + dt.timedelta(seconds=10),
        make_policy("fifo"),
        CycleConfig(),
        "ibpool.io/leaf",
        placement=placement,
    )


def running(job_id: str, node_id: str, gpus: int, limit_s: float) -> JobRecord:
    return msgspec.structs.replace(
        job(job_id, gpus, time_limit_s=limit_s),
        state="running",
        allocation_id=f"a-{job_id}",
        nodes=[node_id],
        assignments=[GpuAssignment(node_id=node_id, gpu_index=i) for i in range(gpus)],
        started_at=T0,
    )


def test_a_job_goes_to_the_first_named_site_when_both_start_it_now() -> None:
    ledger = ledger_of(at_site("e1", "east"), at_site("w1", "west"))
    plan = cycle(ledger, [job("j", 4, sites=["west", "east"])])
    assert hosts_of(plan) == {"j": ["w1"]}
    site, why = plan.sites["j"]
    assert site == "west" and why.startswith("earliest estimated start"), why


def test_a_busy_site_loses_to_one_that_starts_the_job_sooner() -> None:
    ledger = ledger_of(at_site("e1", "east"), at_site("w1", "west"))
    busy = running("r", "w1", 8, limit_s=7200.0)  # west is full for two hours
    plan = cycle(ledger, [busy, job("j", 4, at=5, sites=["west", "east"])])
    assert hosts_of(plan) == {"j": ["e1"]}
    assert plan.sites["j"][0] == "east"


def test_the_dataset_copy_decides_between_sites_that_start_it_equally() -> None:
    ledger = ledger_of(at_site("e1", "east"), at_site("w1", "west"))
    plan = cycle(ledger, [job("j", 4, dataset="ds", sites=["west", "east"])], datasets={"ds": ["e1"]})
    assert plan.sites["j"][0] == "east" and "holds its dataset" in plan.sites["j"][1]
    assert hosts_of(plan) == {"j": ["e1"]}


def test_a_bound_job_waits_for_its_site_even_when_another_is_free() -> None:
    ledger = ledger_of(at_site("e1", "east"), at_site("w1", "west"))
    busy = running("r", "w1", 8, limit_s=7200.0)
    bound = job("j", 4, sites=["west", "east"], site="west")
    plan = cycle(ledger, [busy, bound])
    assert hosts_of(plan) == {} and "j" not in plan.sites
    assert "j" in plan.waiting


def test_a_job_fitting_none_of_its_sites_says_so_and_is_not_placed() -> None:
    ledger = ledger_of(at_site("e1", "east", gpus=4), node("x1", 8))
    plan = cycle(ledger, [job("j", 8, sites=["east", "mars"])])
    assert hosts_of(plan) == {}
    assert plan.sites["j"] == (None, "fits none of the sites it names")


def test_sites_in_a_spec_are_checked_and_kept() -> None:
    spec = JobSpec(name="n", tenant="t", request=ResourceRequest(kind="whole", gpus_per_host=1), sites=["a", "a"])
    assert "distinct" in str(record_from_spec("j", spec, T0))
    kept = record_from_spec("j", msgspec.structs.replace(spec, sites=["b", "a"]), T0)
    assert isinstance(kept, JobRecord) and kept.sites == ["b", "a"] and kept.site is None
