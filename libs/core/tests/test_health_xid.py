"""XID codes by required action, as NVIDIA's catalogue buckets them."""

import pytest

from ibpool_core.health.xid import XID_CATALOGUE, classify_xid, describe_xid, worst_xid


@pytest.mark.parametrize(
    ("code", "want"),
    [
        (13, "application"),
        (31, "application"),
        (43, "application"),
        (45, "none"),
        (48, "gpu_reset"),
        (63, "gpu_reset"),
        (64, "gpu_reset"),
        (74, "gpu_reset"),
        (79, "node_reboot"),
        (92, "none"),
        (94, "application"),
        (95, "gpu_reset"),
        (119, "gpu_reset"),
        (9999, "unknown"),
    ],
)
def test_classify(code: int, want: str) -> None:
    assert classify_xid(code) == want


def test_overrides_win_over_the_catalogue() -> None:
    assert classify_xid(13, {13: "gpu_reset"}) == "gpu_reset"
    assert classify_xid(9999, {9999: "node_reboot"}) == "node_reboot"


@pytest.mark.parametrize(
    ("codes", "want"),
    [
        ([], None),
        ([13], (13, "application")),
        ([13, 48], (48, "gpu_reset")),
        ([48, 79, 13], (79, "node_reboot")),
        ([45, 9999], (9999, "unknown")),
        ([63, 48], (63, "gpu_reset")),  # equals: the first one
    ],
)
def test_worst_of_a_sample(codes: list[int], want: object) -> None:
    assert worst_xid(codes) == want


def test_every_catalogued_code_is_described() -> None:
    assert describe_xid(79) == "XID 79 (GPU has fallen off the bus)"
    assert describe_xid(12345) == "XID 12345"
    assert all(text for _, text in XID_CATALOGUE.values())
