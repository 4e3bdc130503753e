import datetime as dt

from ibpool_core import workload as core
from ibpool_proto.pool import AllocationGranted, AllocationRevoked, Enforcement, GpuAssignment, WorkloadSpec

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
NODES = {"n1": 8}


def grant(
    gpus: list[int], runtime: float | None = 10.0, mem: int | None = None, limit: int | None = None, node: str = "n1"
) -> AllocationGranted:
    return AllocationGranted(
        source="t",
        key=node,
        allocation_id="a1",
        job_id="j1",
        node_id=node,
        kind="whole",
        assignments=[GpuAssignment(node_id=node, gpu_index=g) for g in gpus],
        enforcement=Enforcement(env={"CUDA_VISIBLE_DEVICES": "0"}, memory_limit_mib=limit),
        lease_expires_at=T0,
        ledger_version=1,
        workload=WorkloadSpec(simulated_runtime_s=runtime, simulated_memory_mib=mem),
    )


def admit(g: AllocationGranted, running: set[str] | None = None) -> core.GrantDecision:
    return core.admit_grant(
        g, hosted_nodes=NODES, running=running or set(), now=T0, source="agent", default_runtime_s=60
    )


def test_grant_starts_work_that_ends_after_its_runtime() -> None:
    d = admit(grant([0, 1], runtime=10))
    assert isinstance(d, core.GrantAdmitted)
    assert d.workload.gpu_indices == [0, 1] and d.workload.env == {"CUDA_VISIBLE_DEVICES": "0"}
    assert d.started.job_id == "j1" and d.started.occurred_at == T0
    assert core.finish_due([d.workload], now=T0 + dt.timedelta(seconds=9), source="agent") == []
    [(_, exited)] = core.finish_due([d.workload], now=T0 + dt.timedelta(seconds=10), source="agent")
    assert (exited.reason, exited.exit_code, exited.runtime_s) == ("completed", 0, 10.0)


def test_repeated_grant_is_ignored() -> None:
    assert isinstance(admit(grant([0]), running={"a1"}), core.GrantIgnored)


def test_grant_for_another_node_is_ignored() -> None:
    assert isinstance(admit(grant([0], node="elsewhere")), core.GrantIgnored)


def test_grant_of_missing_gpu_is_refused_with_the_reason() -> None:
    d = admit(grant([8]))
    assert isinstance(d, core.GrantRefused)
    assert d.exited.reason == "failed" and "[8]" in d.exited.detail


def test_work_over_its_memory_limit_is_killed_as_oom() -> None:
    d = admit(grant([0], runtime=100, mem=30_000, limit=20_000))
    assert isinstance(d, core.GrantAdmitted) and d.workload.planned_exit == "oom"
    [(_, exited)] = core.finish_due([d.workload], now=T0 + dt.timedelta(seconds=1), source="agent")
    assert exited.reason == "oom" and exited.exit_code == core.OOM_EXIT_CODE


def test_default_runtime_when_grant_does_not_say() -> None:
    d = admit(grant([0], runtime=None))
    assert isinstance(d, core.GrantAdmitted)
    assert d.workload.ends_at == T0 + dt.timedelta(seconds=60)


def test_revoked_work_exits_with_the_revocation_reason() -> None:
    d = admit(grant([0]))
    assert isinstance(d, core.GrantAdmitted)
    rev = AllocationRevoked(
        source="alloc", key="n1", allocation_id="a1", job_id="j1", node_id="n1", ledger_version=2, reason="node failed"
    )
    exited = core.stop_revoked(d.workload, rev, now=T0 + dt.timedelta(seconds=3), source="agent")
    assert (exited.reason, exited.detail, exited.runtime_s) == ("revoked", "node failed", 3.0)


def test_released_or_expired_work_is_stopped_with_why() -> None:
    from ibpool_proto.pool import AllocationExpired, AllocationReleased

    d = admit(grant([0]))
    assert isinstance(d, core.GrantAdmitted)
    later = T0 + dt.timedelta(seconds=2)
    rel = AllocationReleased(
        source="a", key="n1", allocation_id="a1", job_id="j1", node_id="n1", ledger_version=3, reason="done early"
    )
    exp = AllocationExpired(source="a", key="n1", allocation_id="a1", job_id="j1", node_id="n1", ledger_version=3)
    assert core.stop_revoked(d.workload, rel, now=later, source="agent").detail == "allocation released: done early"
    assert core.stop_revoked(d.workload, exp, now=later, source="agent").detail == "allocation lease expired"


def command_grant(command: list[str]) -> AllocationGranted:
    g = grant([2])
    return AllocationGranted(
        **{**{f: getattr(g, f) for f in g.__struct_fields__}, "workload": WorkloadSpec(command=command)}
    )


def test_a_command_runs_as_a_process_only_where_the_agent_allows_commands() -> None:
    g = command_grant(["train.py", "--epochs", "3"])
    refused = admit(g)
    assert isinstance(refused, core.GrantRefused) and "allow_commands" in refused.exited.detail
    d = core.admit_grant(
        g, hosted_nodes=NODES, running=set(), now=T0, source="agent", default_runtime_s=60, allow_commands=True
    )
    assert isinstance(d, core.GrantAdmitted)
    assert d.workload.launcher == "process" and d.workload.command == ["train.py", "--epochs", "3"]
    assert d.workload.ends_at is None and d.started.launcher == "process"
    assert core.finish_due([d.workload], now=T0 + dt.timedelta(days=1), source="agent") == []


def test_process_exits_are_classified_by_code_signal_and_xids() -> None:
    w = core.Workload(allocation_id="a1", job_id="j1", node_id="n1", gpu_indices=[2], started_at=T0, ends_at=None)
    later = T0 + dt.timedelta(seconds=30)
    cases = [
        (0, (), "completed", 0, ""),
        (3, (), "failed", 3, "exit code 3"),
        (-9, (), "signal", 137, "killed by SIGKILL"),
        (-15, (), "signal", 143, "killed by SIGTERM"),
        (1, (79,), "xid", 1, "exit code 1; XID 79 on its GPUs"),
        (-6, (48, 63), "xid", 134, "killed by SIGABRT; XID 48, 63 on its GPUs"),
        (None, (), "lost", -1, "exit code unknown: the agent restarted while it ran"),
    ]
    for returncode, xids, reason, code, detail in cases:
        e = core.process_exited(w, returncode, now=later, source="agent", xids=xids)
        assert (e.reason, e.exit_code, e.detail) == (reason, code, detail), returncode
        assert e.runtime_s == 30.0


def running_work(allocation_id: str, gpus: list[int], whole: bool = True) -> core.Workload:
    return core.Workload(
        allocation_id=allocation_id,
        job_id="other",
        node_id="n1",
        gpu_indices=gpus,
        started_at=T0,
        ends_at=None,
        whole=whole,
    )


def test_a_grant_past_its_lease_or_for_gpus_running_other_work_is_forged() -> None:
    import msgspec

    live = msgspec.structs.replace(grant([0, 1]), lease_expires_at=T0 + dt.timedelta(minutes=5))
    assert core.forged_grant(live, [], T0) is None
    assert "a replay" in (core.forged_grant(live, [], T0 + dt.timedelta(minutes=6)) or "")
    assert core.forged_grant(live, [running_work("a9", [1])], T0) == "GPU 1 of n1 runs allocation a9"
    assert core.forged_grant(live, [running_work("a9", [2, 3])], T0) is None  # other GPUs
    assert core.forged_grant(live, [running_work("a1", [0, 1])], T0) is None  # its own repeat (ignored later)
    # a fraction shares its GPU with other fractions, never with a whole-GPU grant
    share = msgspec.structs.replace(
        live, kind="fraction", assignments=[GpuAssignment(node_id="n1", gpu_index=1, milli=250, memory_mib=10_000)]
    )
    assert core.forged_grant(share, [running_work("a9", [1], whole=False)], T0) is None
    assert core.forged_grant(share, [running_work("a9", [1], whole=True)], T0) == "GPU 1 of n1 runs allocation a9"
    assert core.forged_grant(live, [running_work("a9", [1], whole=False)], T0) == "GPU 1 of n1 runs allocation a9"


def test_a_workload_knows_whether_it_holds_whole_gpus() -> None:
    started = admit(grant([0]))
    assert isinstance(started, core.GrantAdmitted) and started.workload.whole
