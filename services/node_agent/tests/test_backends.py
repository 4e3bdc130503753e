import threading
import time

import psutil
import pynvml

from ibpool_node_agent.backends import (
    NvmlBackend,
    ReadFailure,
    SimulatedBackend,
    make_backends,
    node_ids,
    nvml_gpu_count,
)
from ibpool_node_agent.config import NodeAgentConfig
from ibpool_node_agent.hosts import HostMeter, HostMetrics
from services.node_agent.tests.fake_nvml import FakeNvml


def test_simulated_backend_hosts_the_configured_nodes() -> None:
    cfg = NodeAgentConfig(nodes=3, node_prefix="rack1", first_node=5, backend="simulated", gpus_per_node=4)
    backends = make_backends(cfg)
    assert [b.node_id for b in backends] == ["rack1-005", "rack1-006", "rack1-007"] == node_ids(cfg)
    assert all(isinstance(b, SimulatedBackend) and len(b.inventory()) == 4 for b in backends)


def test_auto_picks_the_simulation_where_nvml_sees_no_gpu() -> None:
    cfg = NodeAgentConfig(nodes=2, backend="auto")
    if nvml_gpu_count() == 0:
        assert all(b.name == "simulated" for b in make_backends(cfg))
    else:
        assert [b.name for b in make_backends(cfg)] == ["nvml"]


def test_simulated_host_follows_the_work_on_its_gpus() -> None:
    hosts = HostMetrics(simulated={"sim-1"})
    idle, busy = hosts.sample("sim-1", {}), hosts.sample("sim-1", {0: 40_000, 1: 40_000, 2: 8_000})
    assert idle.cpu_pct < busy.cpu_pct <= 100.0
    assert busy.memory_used_mib - idle.memory_used_mib == 88_000 // 4
    assert idle.net_rx_bps == 0.0 < busy.net_rx_bps


def test_host_meter_reads_this_machine() -> None:
    meter = HostMeter()
    sample = meter.sample()
    total_mib = psutil.virtual_memory().total // (1 << 20)
    assert 0.0 <= sample.cpu_pct <= 100.0
    assert 0 < sample.memory_used_mib <= total_mib
    assert sample.net_rx_bps >= 0.0 and sample.net_tx_bps >= 0.0
    assert 0.0 < sample.disk_used_pct <= 100.0


def test_nvml_backend_reads_inventory_and_telemetry_with_xids_and_throttling() -> None:
    nvml = FakeNvml(gpus=2)
    b = NvmlBackend("gpu-node-1", nvml=nvml)
    inv = b.inventory()
    assert [g.uuid for g in inv] == ["GPU-fake-0", "GPU-fake-1"]
    assert inv[0].model == "NVIDIA A100-SXM4-80GB" and inv[0].memory_mib == 81920 and inv[0].mig_capable
    assert inv[0].nvlink_domain == b.hostname and nvml.registered == {0, 1}
    gpu1 = nvml.gpus[1]
    gpu1.util, gpu1.used_mib, gpu1.temperature, gpu1.power_mw = 97, 70_000, 88, 395_500
    gpu1.ecc, gpu1.retired, gpu1.throttle = {0: 2, 1: 5}, [0x1000, 0x2000], 0x20 | 0x4 | 0x1
    for index, xid in [(1, 79), (1, 48), (0, 13)]:
        nvml.raise_xid(index, xid)
    assert b.watches_xids and b.watch_xids(0.0) == 3
    reading = b.sample(5.0, {})
    assert reading.failures == []
    s0, s1 = reading.gpus
    assert (s1.utilization_pct, s1.memory_used_mib, s1.temperature_c, s1.power_w) == (97.0, 70_000, 88.0, 395.5)
    assert (s1.ecc_volatile, s1.ecc_aggregate, s1.retired_pages) == (2, 5, 2)
    assert s1.throttle_reasons == ["sw_power_cap", "sw_thermal_slowdown"]  # idle (0x1) is not a problem
    assert s1.xids == [79, 48] and s0.xids == [13]
    assert b.sample(5.0, {}).gpus[1].xids == []  # each XID reported once
    # A node on real hardware is this machine: its host figures are measured (this was missing on NVML hosts).
    assert 0.0 < HostMetrics(simulated=set()).sample(b.node_id, {0: 1024}).disk_used_pct <= 100.0


def test_nvml_backend_falls_back_to_remapped_rows_and_works_without_events() -> None:
    nvml = FakeNvml(events_supported=False)
    nvml.gpus[0].retired, nvml.gpus[0].remapped, nvml.gpus[0].nvlinks = None, (3, 1, 0, 0), 0
    b = NvmlBackend("gpu-node-1", nvml=nvml)
    [g] = b.inventory()
    assert g.nvlink_domain is None
    assert not b.watches_xids and b.watch_xids(0.5) == 0
    reading = b.sample(5.0, {})
    [s] = reading.gpus
    assert s.retired_pages == 4 and s.xids == [] and reading.failures == []  # not supported is no failure


def test_a_failing_nvml_read_leaves_its_figure_at_the_default_and_says_which_kind_failed() -> None:
    nvml = FakeNvml(gpus=2)
    nvml.gpus[1].temperature, nvml.gpus[1].util = 70, 55
    nvml.failing["nvmlDeviceGetTemperature"] = pynvml.NVML_ERROR_GPU_IS_LOST
    nvml.failing["nvmlDeviceGetCurrentClocksThrottleReasons"] = pynvml.NVML_ERROR_UNKNOWN
    b = NvmlBackend("gpu-node-1", nvml=nvml)
    reading = b.sample(5.0, {})
    assert [g.temperature_c for g in reading.gpus] == [0.0, 0.0]
    assert [g.utilization_pct for g in reading.gpus] == [0.0, 55.0]  # the other figures are still read
    kinds = sorted((f.kind, f.gpu_index) for f in reading.failures)
    assert kinds == [("temperature", 0), ("temperature", 1), ("throttle", 0), ("throttle", 1)]
    assert all(f.error for f in reading.failures)
    del nvml.failing["nvmlDeviceGetTemperature"]
    assert [g.temperature_c for g in b.sample(5.0, {}).gpus] == [35.0, 70.0]


def test_the_xid_watch_returns_as_soon_as_an_xid_arrives_and_reports_a_failing_event_set() -> None:
    nvml = FakeNvml(gpus=2)
    b = NvmlBackend("gpu-node-1", nvml=nvml)
    threading.Timer(0.2, nvml.raise_xid, (1, 79)).start()
    started = time.monotonic()
    assert b.watch_xids(30.0) == 1
    assert time.monotonic() - started < 25.0  # it did not wait out its timeout
    assert [g.xids for g in b.sample(5.0, {}).gpus] == [[], [79]]
    nvml.failing["nvmlEventSetWait_v2"] = pynvml.NVML_ERROR_UNKNOWN
    assert b.watch_xids(0.0) == 0
    [failure] = b.sample(5.0, {}).failures
    assert failure == ReadFailure(kind="xid_events", error=str(pynvml.NVMLError(pynvml.NVML_ERROR_UNKNOWN)))


def test_hostname_in_the_prefix_gives_each_replica_its_own_node_ids() -> None:
    import socket

    cfg = NodeAgentConfig(nodes=2, node_prefix="{hostname}-sim", backend="simulated")
    host = socket.gethostname().split(".")[0]
    assert node_ids(cfg) == [f"{host}-sim-001", f"{host}-sim-002"]


def test_an_injected_xid_is_reported_once_by_the_next_sample_of_that_gpu() -> None:
    [b] = make_backends(NodeAgentConfig(nodes=1, backend="simulated", sim_xid_rate=0.0, gpus_per_node=4))
    assert isinstance(b, SimulatedBackend)
    b.inject_xid(2, 79)
    b.inject_xid(2, 48)
    first, second = b.sample(1.0, {}).gpus, b.sample(1.0, {}).gpus
    assert [g.xids for g in first] == [[], [], [79, 48], []]
    assert all(g.xids == [] for g in second)
    try:
        b.inject_xid(4, 79)
    except ValueError as e:
        assert "no GPU 4" in str(e)
    else:
        raise AssertionError("GPU 4 of a 4-GPU node took an XID")
