"""What the metrics tests share: scrape a service's /metrics, read one sample, and have promtool check it."""

from __future__ import annotations

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

from tests.integration.helpers import promtool, promtool_check_metrics


class Scrape:
    """One scrape of /metrics: its text and its samples by name and labels."""

    def __init__(self, text: bytes) -> None:
        self.text = text
        self.samples: dict[str, list[tuple[dict[str, str], float]]] = {}
        for family in text_string_to_metric_families(text.decode()):
            for s in family.samples:
                self.samples.setdefault(s.name, []).append((dict(s.labels), s.value))

    def value(self, name: str, **labels: str) -> float | None:
        """The value of the sample `name` whose labels include `labels`; None when there is none."""
        found = [v for have, v in self.samples.get(name, []) if labels.items() <= have.items()]
        assert len(found) <= 1, f"{name}{labels} names {len(found)} samples"
        return found[0] if found else None

    def labels(self, name: str, label: str) -> set[str]:
        """The values of `label` over the samples of `name`."""
        return {have[label] for have, _ in self.samples.get(name, [])}


async def scrape(url: str) -> Scrape:
    """GET `url`/metrics, checked by promtool (`promtool check metrics`: it parses and lints names,
    types, help texts and units) when it is installed."""
    async with aiohttp.ClientSession() as http, http.get(f"{url}/metrics") as r:
        assert r.status == 200
        text = await r.read()
    tool = promtool()
    if tool is not None:
        code, out = await promtool_check_metrics(tool, text)
        assert (code, out) == (0, ""), out
    return Scrape(text)
