from ibpool_node_agent.backends import SimulatedBackend, make_backends, node_ids, nvml_gpu_count
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
