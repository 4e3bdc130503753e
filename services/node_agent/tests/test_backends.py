import psutil

from ibpool_node_agent.backends import HostMeter, SimulatedBackend, make_backends, node_ids, nvml_gpu_count
from ibpool_node_agent.config import NodeAgentConfig


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
    [b] = make_backends(NodeAgentConfig(nodes=1, backend="simulated"))
    idle, busy = b.host({}), b.host({0: 40_000, 1: 40_000, 2: 8_000})
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
