from ibpool_core.gpu_model import SimulatedGpus


def test_same_seed_same_numbers() -> None:
    a, b = SimulatedGpus("n1", seed=7), SimulatedGpus("n1", seed=7)
    for _ in range(50):
        assert a.sample(1.0, {0: 10_000}) == b.sample(1.0, {0: 10_000})
    assert a.inventory() == b.inventory()


def test_other_seed_or_node_other_numbers() -> None:
    base = SimulatedGpus("n1", seed=7)
    assert base.inventory() != SimulatedGpus("n1", seed=8).inventory()
    assert base.inventory() != SimulatedGpus("n2", seed=7).inventory()


def test_busy_gpu_heats_up_and_uses_its_memory_idle_one_stays_cool() -> None:
    gpus = SimulatedGpus("n1", seed=1, ecc_rate=0, xid_rate=0)
    for _ in range(120):
        samples = gpus.sample(1.0, {3: 40_000})
    busy, idle = samples[3], samples[0]
    assert busy.utilization_pct > 75 and busy.temperature_c > idle.temperature_c + 20
    assert busy.memory_used_mib >= 40_000 and idle.memory_used_mib == 0
    assert busy.power_w > 3 * idle.power_w


def test_faults_appear_only_when_enabled() -> None:
    quiet = SimulatedGpus("n1", seed=3, ecc_rate=0, xid_rate=0)
    noisy = SimulatedGpus("n1", seed=3, ecc_rate=0.5, xid_rate=0.5)
    q = [s for _ in range(100) for s in quiet.sample(1.0, {})]
    n = [s for _ in range(100) for s in noisy.sample(1.0, {})]
    assert all(not s.xids and s.ecc_volatile == 0 for s in q)
    assert any(s.xids for s in n) and max(s.ecc_aggregate for s in n) > 0


def test_unknown_model_is_refused_with_the_known_ones() -> None:
    try:
        SimulatedGpus("n1", seed=1, model="Voodoo 2")
    except ValueError as e:
        assert "Voodoo 2" in str(e) and "H100" in str(e)
    else:
        raise AssertionError("expected ValueError")
