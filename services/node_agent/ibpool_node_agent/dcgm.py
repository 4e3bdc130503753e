"""Per-GPU metrics under the names and labels of NVIDIA's dcgm-exporter, so GPU dashboards built for it work unchanged.

What dcgm-exporter exports is taken from its release 4.5.3-4.8.2: the fields, types and help texts of
`etc/default-counters.csv`, the labels of `internal/pkg/rendermetrics/render_metrics.go` (`gpu`,
`UUID`, `pci_bus_id`, `device`, `modelName`, `Hostname`, then the csv's `label` fields such as
`DCGM_FI_DRIVER_VERSION`) and the `err_code` / `err_msg` labels that
`internal/pkg/collector/gpu_collector.go` adds to `DCGM_FI_DEV_XID_ERRORS`. Values are in dcgm's units
(%, MiB, degrees C, W), not Prometheus base units: the point is that queries written for
dcgm-exporter read the same numbers; each help text names its unit, as dcgm's do.

The collector reads the agent's newest telemetry sample of every GPU (what the telemetry loop last
published) and the last XID each GPU reported, at scrape time: a scrape costs one pass over the
hosted GPUs, and nothing is sampled or copied for it. Series appear with a node's first sample.
A real agent hosts one node (8 GPUs: 64 series); a simulated agent hosting 1,000 nodes writes
64,000 series (10 MB) a scrape, which prometheus_client formats in about 0.8 s: the route formats
in a thread, so heartbeats and telemetry go on meanwhile.
Fields dcgm types `counter` (the ECC totals) are exported as gauges with the same name and value:
prometheus_client writes a counter's name with `_total` appended, which would change the name.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from ibpool_core.health.xid import XID_CATALOGUE
from ibpool_proto.node import GpuInfo, GpuSample

DCGM_EXPORTER_RELEASE = "4.5.3-4.8.2"

# (name, help) as dcgm-exporter's default-counters.csv has them; the ECC totals are in its csv too,
# commented out (a dcgm-exporter must be configured to export them; the agent always does).
GPU_UTIL = ("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).")
FB_FREE = ("DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB).")
FB_USED = ("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).")
GPU_TEMP = ("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C).")
POWER_USAGE = ("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W).")
XID_ERRORS = ("DCGM_FI_DEV_XID_ERRORS", "Value of the last XID error encountered.")
ECC_DBE_VOL_TOTAL = ("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "Total number of double-bit volatile ECC errors.")
ECC_DBE_AGG_TOTAL = ("DCGM_FI_DEV_ECC_DBE_AGG_TOTAL", "Total number of double-bit persistent ECC errors.")
FIELDS = (GPU_UTIL, FB_FREE, FB_USED, GPU_TEMP, POWER_USAGE, XID_ERRORS, ECC_DBE_VOL_TOTAL, ECC_DBE_AGG_TOTAL)

# dcgm-exporter's err_msg for code 0 and for a code its table lacks.
NO_ERROR = "No Error"
UNKNOWN_ERROR = "Unknown Error"


@dataclass(frozen=True, slots=True)
class DcgmHost:
    """One hosted node as dcgm-exporter labels its GPUs; fixed for the agent's life (read once, at start)."""

    node_id: str
    # The `Hostname` label: the machine's name on NVML hosts, the node id on simulated ones.
    hostname: str
    gpus: Sequence[GpuInfo]
    # GPU index -> PCI bus id ("00000000:07:00.0"), where the backend reads it (NVML); else no label.
    pci_bus_ids: Mapping[int, str] = field(default_factory=dict)
    # The `DCGM_FI_DRIVER_VERSION` label (a default dcgm field of type `label`), where known (NVML).
    driver_version: str | None = None


def gpu_labels(host: DcgmHost, info: GpuInfo) -> dict[str, str]:
    """The labels dcgm-exporter gives a (non-MIG) GPU's series; those the backend cannot read are left out."""
    labels = {
        "gpu": str(info.index),
        "UUID": info.uuid,
        "device": f"nvidia{info.index}",
        "modelName": info.model,
        "Hostname": host.hostname,
    }
    if (bus_id := host.pci_bus_ids.get(info.index)) is not None:
        labels["pci_bus_id"] = bus_id
    if host.driver_version is not None:
        labels["DCGM_FI_DRIVER_VERSION"] = host.driver_version
    return labels


def xid_message(code: int) -> str:
    """`err_msg` of an XID: dcgm-exporter's words for 0 and unknown codes, ibpool's XID catalogue's otherwise."""
    if code == 0:
        return NO_ERROR
    entry = XID_CATALOGUE.get(code)
    return UNKNOWN_ERROR if entry is None else entry[1]


class DcgmCollector(Collector):
    """The newest sample of every hosted GPU, as dcgm-exporter would export it.

    `latest` is node id -> the GPUs of the node's newest sample, `xids` node id -> GPU index -> the
    (when, code) XIDs seen, oldest first: both the agent's own, read (never copied) at each scrape.
    """

    def __init__(
        self,
        hosts: Sequence[DcgmHost],
        latest: Mapping[str, Sequence[GpuSample]],
        xids: Mapping[str, Mapping[int, Sequence[tuple[object, int]]]],
    ) -> None:
        self.latest = latest
        self.xids = xids
        self._hosts = {h.node_id: h for h in hosts}
        # node id -> GPU index -> (labels, total memory MiB): built once, shared by every scrape's samples
        self._gpus = {h.node_id: {g.index: (gpu_labels(h, g), g.memory_mib) for g in h.gpus} for h in hosts}

    def collect(self) -> Iterator[Metric]:
        util, free, used, temp, power, xid, ecc_vol, ecc_agg = families = [
            GaugeMetricFamily(name, doc) for name, doc in FIELDS
        ]
        # A snapshot of the keys: the scrape is formatted in a thread while the telemetry loop goes on.
        for node_id, gpus in list(self.latest.items()):
            known = self._gpus.get(node_id)
            if known is None:
                continue  # not a node of this collector's
            node_xids = self.xids.get(node_id, {})
            for g in gpus:
                labels, total_mib = known.get(g.index) or self._unknown_gpu(node_id, g)
                util.add_sample(util.name, labels, g.utilization_pct)
                used.add_sample(used.name, labels, g.memory_used_mib)
                free.add_sample(free.name, labels, max(0, total_mib - g.memory_used_mib))
                temp.add_sample(temp.name, labels, g.temperature_c)
                power.add_sample(power.name, labels, g.power_w)
                seen = node_xids.get(g.index)
                last = seen[-1][1] if seen else 0
                xid.add_sample(xid.name, {**labels, "err_code": str(last), "err_msg": xid_message(last)}, last)
                ecc_vol.add_sample(ecc_vol.name, labels, g.ecc_volatile)
                ecc_agg.add_sample(ecc_agg.name, labels, g.ecc_aggregate)
        yield from families

    def _unknown_gpu(self, node_id: str, g: GpuSample) -> tuple[dict[str, str], int]:
        """A GPU the inventory did not list at start: labelled from its sample (model and size unknown)."""
        info = GpuInfo(index=g.index, uuid=g.uuid, model="", memory_mib=g.memory_used_mib)
        return gpu_labels(self._hosts[node_id], info), info.memory_mib
