"""The dcgm-exporter metrics of the node agent (dcgm.py), built over samples: no bus, no store.

`DCGM_DEFAULTS` is what dcgm-exporter 4.5.3-4.8.2 declares for the fields exported here (name, type,
help), from its `etc/default-counters.csv`; the ECC totals are the commented-out lines of that file.
"""

from __future__ import annotations

import pynvml
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from ibpool_node_agent.backends import NvmlBackend
from ibpool_node_agent.dcgm import FIELDS, DcgmCollector, DcgmHost
from ibpool_proto.node import GpuInfo, GpuSample
from services.node_agent.tests.fake_nvml import FakeNvml

DCGM_DEFAULTS = {
    "DCGM_FI_DEV_GPU_TEMP": ("gauge", "GPU temperature (in C)."),
    "DCGM_FI_DEV_POWER_USAGE": ("gauge", "Power draw (in W)."),
    "DCGM_FI_DEV_GPU_UTIL": ("gauge", "GPU utilization (in %)."),
    "DCGM_FI_DEV_XID_ERRORS": ("gauge", "Value of the last XID error encountered."),
    "DCGM_FI_DEV_FB_FREE": ("gauge", "Framebuffer memory free (in MiB)."),
    "DCGM_FI_DEV_FB_USED": ("gauge", "Framebuffer memory used (in MiB)."),
    # counters in dcgm's csv (commented out there); gauges here, so that the names stay dcgm's
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL": ("counter", "Total number of double-bit volatile ECC errors."),
    "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL": ("counter", "Total number of double-bit persistent ECC errors."),
}
MODEL = "NVIDIA H100 80GB HBM3"


def scrape(collector: DcgmCollector) -> dict[str, list[Sample]]:
    """The collector's text exposition, parsed back: family name -> its samples; types and help checked."""
    registry = CollectorRegistry()
    registry.register(collector)
    families = list(text_string_to_metric_families(generate_latest(registry).decode()))
    for f in families:
        assert f.type == "gauge", f.name
        assert f.documentation == DCGM_DEFAULTS[f.name][1], f.name
    return {f.name: f.samples for f in families}


def by_gpu(samples: list[Sample], hostname: str) -> dict[str, Sample]:
    return {s.labels["gpu"]: s for s in samples if s.labels["Hostname"] == hostname}


def gpu(index: int, util: float, used: int, temp: float, power: float, vol: int = 0, agg: int = 0) -> GpuSample:
    return GpuSample(
        index=index,
        uuid=f"GPU-{index}",
        utilization_pct=util,
        memory_used_mib=used,
        temperature_c=temp,
        power_w=power,
        ecc_volatile=vol,
        ecc_aggregate=agg,
    )


def test_every_gpu_is_exported_under_dcgm_names_types_labels_and_units() -> None:
    assert sorted(name for name, _ in FIELDS) == sorted(DCGM_DEFAULTS)
    infos = [GpuInfo(index=i, uuid=f"GPU-{i}", model=MODEL, memory_mib=81_559) for i in range(2)]
    hosts = [
        DcgmHost(node_id="sim-001", hostname="sim-001", gpus=infos),
        DcgmHost(node_id="sim-002", hostname="sim-002", gpus=infos),
        DcgmHost(node_id="sim-003", hostname="sim-003", gpus=infos),  # no sample yet: no series
    ]
    latest = {
        "sim-001": [gpu(0, 37.0, 20_000, 51.5, 312.25), gpu(1, 0.0, 0, 33.0, 70.0, vol=2, agg=5)],
        "sim-002": [gpu(0, 100.0, 81_559, 80.0, 700.0), gpu(1, 12.5, 1_000, 40.0, 90.0)],
    }
    # (when, code) oldest first, as the agent keeps them: the last one is dcgm's "last XID".
    xids: dict[str, dict[int, list[tuple[object, int]]]] = {
        "sim-001": {1: [("t1", 48), ("t2", 79)]},
        "sim-002": {0: [("t1", 999)]},
        "sim-003": {},
    }
    got = scrape(DcgmCollector(hosts, latest, xids))
    assert sorted(got) == sorted(DCGM_DEFAULTS)
    assert all(len(samples) == 4 for samples in got.values())  # 2 sampled nodes x 2 GPUs, sim-003 none
    util = by_gpu(got["DCGM_FI_DEV_GPU_UTIL"], "sim-001")
    assert util["0"].name == "DCGM_FI_DEV_GPU_UTIL"
    assert util["0"].labels == {
        "gpu": "0",
        "UUID": "GPU-0",
        "device": "nvidia0",
        "modelName": MODEL,
        "Hostname": "sim-001",
    }
    assert util["1"].labels["device"] == "nvidia1" and util["1"].labels["UUID"] == "GPU-1"

    def values(name: str, hostname: str) -> list[float]:
        return [s.value for _, s in sorted(by_gpu(got[name], hostname).items())]

    # dcgm's units: %, MiB, degrees C, W, error counts; FB_FREE is the inventory's total less FB_USED
    assert values("DCGM_FI_DEV_GPU_UTIL", "sim-001") == [37.0, 0.0]
    assert values("DCGM_FI_DEV_FB_USED", "sim-001") == [20_000, 0]
    assert values("DCGM_FI_DEV_FB_FREE", "sim-001") == [61_559, 81_559]
    assert values("DCGM_FI_DEV_FB_FREE", "sim-002") == [0, 80_559]
    assert values("DCGM_FI_DEV_GPU_TEMP", "sim-001") == [51.5, 33.0]
    assert values("DCGM_FI_DEV_POWER_USAGE", "sim-001") == [312.25, 70.0]
    assert values("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "sim-001") == [0, 2]
    assert values("DCGM_FI_DEV_ECC_DBE_AGG_TOTAL", "sim-001") == [0, 5]
    # the last XID's code, with dcgm-exporter's err_code / err_msg labels
    xid1, xid2 = by_gpu(got["DCGM_FI_DEV_XID_ERRORS"], "sim-001"), by_gpu(got["DCGM_FI_DEV_XID_ERRORS"], "sim-002")
    assert (xid1["0"].value, xid1["0"].labels["err_code"], xid1["0"].labels["err_msg"]) == (0, "0", "No Error")
    assert (xid1["1"].value, xid1["1"].labels["err_code"]) == (79, "79")
    assert xid1["1"].labels["err_msg"] == "GPU has fallen off the bus"
    assert (xid2["0"].value, xid2["0"].labels["err_msg"]) == (999, "Unknown Error")
    assert {k: v for k, v in xid1["1"].labels.items() if not k.startswith("err_")} == util["1"].labels


def test_a_scrape_reads_the_agents_newest_sample_as_it_is_now() -> None:
    """The collector holds the agent's own mappings: a later sample or XID shows at the next scrape."""
    infos = [GpuInfo(index=0, uuid="GPU-0", model=MODEL, memory_mib=81_559)]
    latest: dict[str, list[GpuSample]] = {}
    xids: dict[str, dict[int, list[tuple[object, int]]]] = {"n1": {}}
    collector = DcgmCollector([DcgmHost(node_id="n1", hostname="h1", gpus=infos)], latest, xids)
    assert scrape(collector) == {name: [] for name in DCGM_DEFAULTS}  # no sample yet: no series
    latest["n1"] = [gpu(0, 10.0, 100, 30.0, 60.0)]
    assert [s.value for s in scrape(collector)["DCGM_FI_DEV_GPU_UTIL"]] == [10.0]
    latest["n1"] = [gpu(0, 90.0, 100, 30.0, 60.0)]
    xids["n1"].setdefault(0, []).append(("t", 13))
    got = scrape(collector)
    assert [s.value for s in got["DCGM_FI_DEV_GPU_UTIL"]] == [90.0]
    assert [(s.value, s.labels["err_code"]) for s in got["DCGM_FI_DEV_XID_ERRORS"]] == [(13, "13")]


def test_the_nvml_backend_adds_pci_bus_id_and_driver_version() -> None:
    nvml = FakeNvml(gpus=2)
    nvml.gpus[1].util, nvml.gpus[1].used_mib, nvml.gpus[1].temperature, nvml.gpus[1].power_mw = 80, 4_096, 66, 250_500
    b = NvmlBackend("gpu-node-1", nvml=nvml)
    host = DcgmHost(
        node_id=b.node_id,
        hostname=b.hostname,
        gpus=b.inventory(),
        pci_bus_ids=b.pci_bus_ids,
        driver_version=b.driver_version,
    )
    got = scrape(DcgmCollector([host], {b.node_id: b.sample(1.0, {}).gpus}, {b.node_id: {}}))
    util = by_gpu(got["DCGM_FI_DEV_GPU_UTIL"], b.hostname)
    assert util["1"].labels == {
        "gpu": "1",
        "UUID": "GPU-fake-1",
        "pci_bus_id": "00000000:17:00.0",
        "device": "nvidia1",
        "modelName": "NVIDIA A100-SXM4-80GB",
        "Hostname": b.hostname,
        "DCGM_FI_DRIVER_VERSION": "fake",
    }
    assert util["0"].labels["pci_bus_id"] == "00000000:07:00.0"
    assert util["1"].value == 80.0
    assert by_gpu(got["DCGM_FI_DEV_FB_USED"], b.hostname)["1"].value == 4_096
    assert by_gpu(got["DCGM_FI_DEV_FB_FREE"], b.hostname)["1"].value == 81_920 - 4_096
    assert by_gpu(got["DCGM_FI_DEV_GPU_TEMP"], b.hostname)["1"].value == 66.0
    assert by_gpu(got["DCGM_FI_DEV_POWER_USAGE"], b.hostname)["1"].value == 250.5


def test_labels_nvml_cannot_read_are_left_out() -> None:
    nvml = FakeNvml(gpus=1)
    nvml.failing["nvmlDeviceGetPciInfo"] = pynvml.NVML_ERROR_GPU_IS_LOST
    b = NvmlBackend("gpu-node-1", nvml=nvml)
    assert b.pci_bus_ids == {} and b.driver_version == "fake"
    host = DcgmHost(node_id=b.node_id, hostname=b.hostname, gpus=b.inventory(), pci_bus_ids=b.pci_bus_ids)
    got = scrape(DcgmCollector([host], {b.node_id: b.sample(1.0, {}).gpus}, {b.node_id: {}}))
    [only] = got["DCGM_FI_DEV_GPU_TEMP"]
    assert "pci_bus_id" not in only.labels and "DCGM_FI_DRIVER_VERSION" not in only.labels
