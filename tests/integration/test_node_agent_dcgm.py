"""The node agent's dcgm-exporter metrics (GET /metrics/dcgm) over real HTTP, on real NATS and Postgres,
checked by their consumer: Prometheus's own parser and linter (`promtool check metrics`)."""

from __future__ import annotations

import re

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from ibpool_proto import decode_as
from ibpool_proto.node import NodeRegistered
from ibpool_runtime.bus import Bus
from ibpool_runtime.store import Store
from tests.integration.agent_support import running_agent
from tests.integration.helpers import eventually, promtool, promtool_check_metrics, stream_messages

FAMILIES = {
    "DCGM_FI_DEV_GPU_UTIL",
    "DCGM_FI_DEV_FB_USED",
    "DCGM_FI_DEV_FB_FREE",
    "DCGM_FI_DEV_GPU_TEMP",
    "DCGM_FI_DEV_POWER_USAGE",
    "DCGM_FI_DEV_XID_ERRORS",
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
    "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL",
}
# What promtool says of dcgm-exporter's `modelName` label, in its output as in ours.
CAMEL_CASE = re.compile(r"^DCGM_FI_DEV_\w+ label names should be written in 'snake_case' not 'camelCase'$")


async def test_agent_serves_each_gpu_under_dcgm_exporters_names_and_labels(bus: Bus, store: Store) -> None:
    async with (
        # quiet GPUs (no random ECC errors or XIDs): the only XID is the injected one
        running_agent(bus, store, nodes=2, fault_injection=True, sim_ecc_rate=0.0, sim_xid_rate=0.0) as svc,
        aiohttp.ClientSession() as http,
    ):
        prefix = svc.kit.config.node_prefix
        ids = [f"{prefix}-001", f"{prefix}-002"]
        registered: dict[str, NodeRegistered] = {}

        async def all_registered() -> bool:
            for n in ids:
                for m in await stream_messages(bus.js, "IBPOOL_NODE", NodeRegistered.subject(n)):
                    registered[n] = decode_as(m.data, NodeRegistered)
            return len(registered) == 2

        await eventually(all_registered, what="both nodes registered")
        async with http.post(f"{svc.http_url}/v1/nodes/{ids[1]}/gpus/5/xid", json={"code": 79}) as r:
            assert r.status == 202

        text = b""
        families: dict[str, list[Sample]] = {}

        async def scraped() -> bool:
            nonlocal text, families
            async with http.get(f"{svc.http_url}/metrics/dcgm") as r:
                assert r.status == 200 and r.headers["Content-Type"].startswith("text/plain")
                text = await r.read()
            families = {f.name: f.samples for f in text_string_to_metric_families(text.decode())}
            xids = {(s.labels["Hostname"], s.labels["gpu"]): s.value for s in families["DCGM_FI_DEV_XID_ERRORS"]}
            return len(xids) == 16 and xids[(ids[1], "5")] == 79

        await eventually(scraped, what="every GPU of both nodes, with the injected XID, in /metrics/dcgm")
        assert set(families) == FAMILIES
        for name, samples in families.items():
            assert len(samples) == 16, name  # 2 nodes x 8 GPUs, one series each
            assert all(s.name == name for s in samples)
        for n in ids:
            for g in registered[n].gpus:
                labels = {
                    "gpu": str(g.index),
                    "UUID": g.uuid,
                    "device": f"nvidia{g.index}",
                    "modelName": g.model,
                    "Hostname": n,  # a simulated node is its own host; it has no PCI bus id nor driver
                }

                def one(name: str, n: str = n, index: int = g.index) -> Sample:
                    [s] = [s for s in families[name] if s.labels["Hostname"] == n and s.labels["gpu"] == str(index)]
                    return s

                assert one("DCGM_FI_DEV_GPU_UTIL").labels == labels
                assert 0.0 <= one("DCGM_FI_DEV_GPU_UTIL").value <= 100.0  # %
                used, free = one("DCGM_FI_DEV_FB_USED").value, one("DCGM_FI_DEV_FB_FREE").value
                assert used >= 0 and free >= 0 and used + free == g.memory_mib  # MiB
                assert 10.0 < one("DCGM_FI_DEV_GPU_TEMP").value < 120.0  # degrees C
                assert 0.0 < one("DCGM_FI_DEV_POWER_USAGE").value < 1_500.0  # W
                assert one("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL").value == 0  # quiet GPUs: no random faults
                assert one("DCGM_FI_DEV_ECC_DBE_AGG_TOTAL").value == 0
                xid = one("DCGM_FI_DEV_XID_ERRORS")
                if (n, g.index) == (ids[1], 5):
                    assert xid.value == 79
                    assert xid.labels == labels | {"err_code": "79", "err_msg": "GPU has fallen off the bus"}
                else:
                    assert xid.value == 0 and xid.labels == labels | {"err_code": "0", "err_msg": "No Error"}

        # They are on a path of their own: the service's /metrics is unchanged.
        async with http.get(f"{svc.http_url}/metrics") as r:
            assert r.status == 200 and b"DCGM_" not in await r.read()

    tool = promtool()
    if tool is None:
        pytest.skip("promtool is not installed (Debian's prometheus package)")
    code, out = await promtool_check_metrics(tool, text)
    # promtool parses all of it; its only remark is the one dcgm-exporter's own output draws: the
    # `modelName` label, kept because dashboards use it (exit code 3: lint problems, not a parse error).
    problems = out.splitlines()
    assert code == 3 and problems, out
    assert [p for p in problems if not CAMEL_CASE.match(p)] == []
    assert {p.split()[0] for p in problems} == FAMILIES
    # With that one label renamed, promtool finds nothing: names, types, help texts and units pass.
    assert b"model_name=" not in text
    code, out = await promtool_check_metrics(tool, text.replace(b"modelName=", b"model_name="))
    assert (code, out) == (0, "")
