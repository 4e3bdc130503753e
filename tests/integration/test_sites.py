"""Multi-site end to end, against real NATS and Postgres, with the scheduler, the pool allocator and
one node agent per node in-process, each node labelled with its site: a job naming two sites goes to
the one that can start it first, a job bound to a busy site waits for it while another site is free,
and a bad list of sites is refused with where it is wrong."""

from __future__ import annotations

from ibpool_runtime.bus import Bus
from ibpool_runtime.devstack import StackInfo
from ibpool_runtime.store import Store
from tests.integration.helpers import eventually
from tests.integration.test_scheduler import call, job_id, job_state
from tests.integration.test_sharp_grant import labelled_cluster

SITE = "ibpool.io/site"
HOLDING = ("scheduled", "running")


async def test_a_job_naming_two_sites_starts_at_the_free_one_and_a_bound_job_waits_for_its_own(
    bus: Bus, store: Store, stack: StackInfo
) -> None:
    labels = [{SITE: "east"}, {SITE: "east"}, {SITE: "west"}, {SITE: "west"}]
    async with labelled_cluster(bus, store, stack, labels) as (service, node_ids, _agents):
        east, west = node_ids[:2], node_ids[2:]

        async def submit(body: dict[str, object]) -> str:
            j = job_id()
            status, view = await call(service, "POST", "/v1/jobs", {"id": j, "tenant": "t", **body})
            assert status == 201, view
            assert view["sites"] == body["sites"] and view["site"] is None, view
            return j

        async def holding(j: str) -> dict[str, object]:
            async def placed() -> bool:
                return (await job_state(service, j))["state"] in HOLDING

            await eventually(placed, what=f"job {j} placed")
            return await job_state(service, j)

        # West is full for ten minutes (every GPU of both its nodes).
        blocker = await submit(
            {"hosts": 2, "gpus_per_host": 8, "sites": ["west"], "workload": {"simulated_runtime_s": 600}}
        )
        held = await holding(blocker)
        assert sorted(held["nodes"]) == west and held["site"] == "west", held  # type: ignore[arg-type]

        # West is named first, but east starts it now.
        either = await submit({"gpus": 4, "sites": ["west", "east"], "workload": {"simulated_runtime_s": 600}})
        placed = await holding(either)
        assert placed["site"] == "east" and placed["nodes"][0] in east, placed  # type: ignore[index]
        assert str(placed["site_reason"]).startswith("earliest estimated start"), placed

        # Bound to west: it waits there, although east still has free GPUs.
        bound = await submit({"gpus": 4, "sites": ["west"], "workload": {"simulated_runtime_s": 60}})

        async def bound_to_west() -> bool:
            view = await job_state(service, bound)
            return view["site"] == "west" and view["state"] == "queued" and bool(view["reason"])

        await eventually(bound_to_west, what="the job bound to the busy site, waiting with a reason")

        for bad, path in (({"sites": "west"}, "$.sites"), ({"sites": ["west", ""]}, "$.sites[1]")):
            status, err = await call(service, "POST", "/v1/jobs", {"id": job_id(), "tenant": "t", **bad})
            assert status == 400 and err["path"] == path, err
        status, err = await call(service, "POST", "/v1/jobs", {"id": job_id(), "tenant": "t", "sites": ["a", "a"]})
        assert status == 422 and "distinct" in err["detail"], err

        for j in (blocker, either, bound):
            await call(service, "DELETE", f"/v1/jobs/{j}")
        assert (await job_state(service, bound))["state"] == "cancelled"
