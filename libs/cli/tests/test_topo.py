"""`ibpool topo`: convert, show, diff, generate, on the real fabrics in ../shared/data/fabrics and on
generated ones; exit codes (0 ok, 1 usage, 2 input) and messages without tracebacks.

Tests that read the shared data skip only when it is absent, and fail instead when
IBPOOL_REQUIRE_SHARED_DATA=1 (as CI sets).
"""

from __future__ import annotations

import io
import json
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from ibpool_cli.__main__ import main
from ibpool_core.fabric.formats import EXPORT_FORMATS, build_hierarchy, guess_format, import_topology, leaf_groups
from ibpool_core.fabric.formats.slurm import expand_hostlist, import_slurm
from ibpool_core.fabric.generators import GENERATORS
from ibpool_core.fabric.model import Topology, unnamed_host
from ibpool_sim.shared_data import need

REPO = Path(__file__).resolve().parents[3]
DUMPS = ["1.topo", "2.topo", "3.topo", "4.topo"]

# small instances of every generator (the SuperPOD at its published 127-node, 4-SU size)
KINDS: dict[str, list[str]] = {
    "single_switch": ["hosts=8", "radix=16"],
    "fat_tree_2tier": ["hosts=40", "radix=16", "oversubscription=3"],
    "fat_tree_3tier": ["hosts=16", "radix=4"],
    "rail_optimised": ["hosts=127"],
    "torus_3d": ["x=3", "y=2", "z=2"],
    "dragonfly": ["groups=3", "routers_per_group=2", "hosts_per_router=2", "global_links_per_router=1"],
}


def run(capsys: pytest.CaptureFixture[str], *argv: str | Path) -> tuple[int, str, str]:
    """`ibpool topo ARGV` in-process: (exit code, stdout, stderr)."""
    code = main(["topo", *(str(a) for a in argv)])
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return code, out, err


def show_json(capsys: pytest.CaptureFixture[str], *argv: str | Path) -> dict[str, Any]:
    code, out, err = run(capsys, "show", *argv, "--format", "json")
    assert code == 0, err
    summary: dict[str, Any] = json.loads(out)
    return summary


def generate(capsys: pytest.CaptureFixture[str], path: Path, kind: str, *params: str) -> Path:
    code, _, err = run(capsys, "generate", kind, *params, "-o", path)
    assert code == 0, err
    return path


# ----------------------------------------------------------------------------------- convert


def slurm_nodes(text: str) -> dict[str, frozenset[str]]:
    """Switch name -> node set of every Nodes= line."""
    out = {}
    for m in re.finditer(r"^SwitchName=(\S+).*?\bNodes=(\S+)", text, re.M):
        out[m[1]] = frozenset(expand_hostlist(m[2]))
    return out


def test_convert_x5_to_slurm_gives_a_tree_with_the_sites_leaf_groups(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    dump, names = need("fabrics/psmn-x5/X5.topofile"), need("fabrics/psmn-x5/X5.map")
    out = tmp_path / "topology.conf"
    code, stdout, err = run(
        capsys, "convert", "--from", "ibnetdiscover", dump, "--names", names, "--to", "slurm", "-o", out
    )
    assert code == 0 and stdout == ""
    # the three adapters X5.map does not name are warned about on stderr, once, FILE:LINE: message,
    # and left out of the Slurm file (the site's own file lists them as nodes H-<guid>)
    assert len(re.findall(r"^warning: .*X5\.topofile:\d+: 3 adapter\(s\) name no host", err, re.M)) == 1
    text = out.read_text()
    tree = import_slurm(text, file="topology.conf", strict=True)  # strict: a cycle or undefined switch raises
    hierarchy = build_hierarchy(tree)
    assert len(hierarchy.roots) == 1
    hosts = [h for u in hierarchy.units.values() for h in u.hosts]
    assert len(hosts) == len(set(hosts)) == 86  # every named node under exactly one leaf
    # the same host set per leaf switch as the site's own topology.conf, less the three H-<guid>
    site = {
        s: frozenset(h for h in hosts if not unnamed_host(h))
        for s, hosts in slurm_nodes(need("fabrics/psmn-x5/X5.topology.conf").read_text()).items()
    }
    assert slurm_nodes(text) == site


def test_convert_reads_stdin_and_writes_stdout(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    dump = need("fabrics/ibtopotool/3.topo")
    monkeypatch.setattr(sys, "stdin", io.StringIO(dump.read_text()))
    code, out, err = run(capsys, "convert", "-", "--to", "slurm")
    assert code == 0
    assert "SwitchName=switch-de779e Nodes=r-ufm[96,100-101]" in out
    assert "<stdin>:1: the discovery reported an error" in err  # warnings on stderr, not in the output
    assert "umad" not in out


def test_show_reads_the_topology_the_fabric_monitor_serves_from_stdin(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # `curl $FM/v1/topology | ibpool topo show -`: a bare Topology object, no `format` wrapper
    fabric = generate(capsys, tmp_path / "f.json", "fat_tree_2tier", "hosts=40", "radix=16")
    served = json.dumps(json.loads(fabric.read_text())["topology"])
    monkeypatch.setattr(sys, "stdin", io.StringIO(served))
    summary = show_json(capsys, "-")
    assert summary["format"] == "native" and summary["hosts"] == 40


def test_convert_nodes_keeps_only_those_hosts(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    fabric = generate(capsys, tmp_path / "f.json", "fat_tree_2tier", "hosts=40", "radix=16")
    code, out, _ = run(capsys, "convert", fabric, "--to", "slurm-block", "--nodes", "node[001-004,039]")
    assert code == 0
    nodes = set()
    for m in re.finditer(r"Nodes=(\S+)", out):
        nodes.update(expand_hostlist(m[1]))
    assert nodes == {"node001", "node002", "node003", "node004", "node039"}


@pytest.mark.parametrize("fmt", EXPORT_FORMATS)
def test_every_export_reads_back_with_the_format_guessed(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, fmt: str
) -> None:
    fabric = generate(capsys, tmp_path / "f.json", "fat_tree_2tier", "hosts=20", "radix=8")
    suffix = ".json" if fmt.endswith(("json", "native")) else ".yaml" if fmt.endswith("yaml") else ".txt"
    out = tmp_path / f"out{suffix}"
    code, _, err = run(capsys, "convert", fabric, "--to", fmt, "-o", out)
    assert code == 0, err
    expected = {
        "slurm-yaml": "slurm",
        "slurm-block": "slurm",
        "native-yaml": "native",
        "k8s-labels-json": "k8s-labels",
    }.get(fmt, fmt)
    assert guess_format(str(out), out.read_text()) == expected
    summary = show_json(capsys, out)
    assert summary["format"] == expected
    assert summary["hosts"] == 20 and summary["leaf_groups"] == 5


# -------------------------------------------------------------------------------------- show


@pytest.mark.parametrize("dump", DUMPS)
def test_show_every_ibtopotool_dump(capsys: pytest.CaptureFixture[str], dump: str) -> None:
    path = need(f"fabrics/ibtopotool/{dump}")
    code, out, _ = run(capsys, "show", path, "--tree")
    assert code == 0
    assert "hosts" in out and "link speeds" in out and "hash" in out
    topology = import_topology("ibnetdiscover", path.read_text(), file=dump)
    summary = show_json(capsys, path)
    assert summary["format"] == "ibnetdiscover"
    assert (summary["hosts"], summary["cas"], summary["switches"], summary["links"]) == (
        len(topology.hosts),
        len(topology.cas),
        len(topology.switches),
        len(topology.links),
    )
    assert len(summary["warnings"]) == len(topology.warnings)


def test_show_x5_summary(capsys: pytest.CaptureFixture[str]) -> None:
    dump, names = need("fabrics/psmn-x5/X5.topofile"), need("fabrics/psmn-x5/X5.map")
    summary = show_json(capsys, dump, "--names", names, "--tree")
    assert summary["hosts"] == 89 and summary["switches"] == 11 and summary["leaf_groups"] == 6
    tiers = {t["tier"]: t for t in summary["tiers"]}
    assert tiers[1]["switches"] == 6
    assert len(summary["warnings"]) == 2  # the import's (three unnamed adapters, one warning) and the tree's
    leaves: list[str] = []
    stack: list[dict[str, Any]] = list(summary["trees"])
    while stack:
        unit = stack.pop()
        if unit.get("hosts"):
            leaves.extend(expand_hostlist(unit["hosts"]))
        stack.extend(unit.get("children", []))
    assert len(leaves) == len(set(leaves)) == 86  # the three unnamed adapters are left out of the tree


def test_show_rail_optimised_superpod(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    fabric = generate(capsys, tmp_path / "superpod.json", "rail_optimised", "hosts=127")
    summary = show_json(capsys, fabric)
    # NVIDIA DGX SuperPOD (H100) reference: 127 nodes, 4 SUs, 32 leaves, 16 spines, 1016 + 1024 cables
    assert (summary["hosts"], summary["cas"], summary["gpus"], summary["links"]) == (127, 1016, 1016, 2040)
    tiers = {t["tier"]: t for t in summary["tiers"]}
    assert tiers[1]["switches"] == 32 and tiers[2]["switches"] == 16
    assert tiers[1]["down_gbps"] == 1016 * 400 and tiers[1]["up_gbps"] == 1024 * 400
    assert tiers[2]["oversubscription"] is None  # the top has no uplinks
    assert summary["rails"] == [{"rail": r, "hosts": 127} for r in range(8)]
    assert summary["hosts_by_rail_count"] == [{"rails": 8, "hosts": 127}]
    assert summary["link_rates"] == [
        {"rate": "4xNDR", "gbps": 400.0, "links": 2040, "host_links": 1016, "switch_links": 1024}
    ]
    assert summary["sharp_switches"] == 48 and summary["leaf_groups"] == 4
    code, out, _ = run(capsys, "show", fabric, "--tree")
    assert code == 0
    assert "spine[01-16]" in out and "dgx[001-032]" in out and "dgx[097-127]" in out


def test_show_counts_down_links_and_missing_rails(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    fabric = generate(capsys, tmp_path / "superpod.json", "rail_optimised", "hosts=127")
    document = json.loads(fabric.read_text())
    document["topology"]["links"][0]["state"] = "down"  # dgx001's rail-0 cable
    today = tmp_path / "today.json"
    today.write_text(json.dumps(document))
    code, out, _ = run(capsys, "show", today)
    assert code == 0
    assert "2040 (1 down)" in out
    assert "8 (rails 1-7: 127 hosts each; rail 0: 126 hosts)" in out
    assert "1 with 7 rails, 126 with 8 rails" in out


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_generate_every_kind_and_show_it(capsys: pytest.CaptureFixture[str], tmp_path: Path, kind: str) -> None:
    path = tmp_path / f"{kind}.json"
    code, out, err = run(capsys, "generate", kind, *KINDS[kind], "-o", path)
    assert code == 0 and out == ""
    assert err.startswith("generated ") and err.count("\n") == 1  # the one-line summary
    summary = show_json(capsys, path)
    topology = GENERATORS[kind](**{k: float(v) if "." in v else int(v) for k, v in (p.split("=") for p in KINDS[kind])})
    assert summary["hosts"] == len(topology.hosts) and summary["links"] == len(topology.links)
    code, out, _ = run(capsys, "show", path, "--tree")
    assert code == 0 and "tiers" in out


def test_generate_oversubscription_shows_per_tier(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    fabric = generate(capsys, tmp_path / "ft.json", "fat_tree_2tier", "hosts=48", "radix=16", "oversubscription=3")
    tiers = {t["tier"]: t for t in show_json(capsys, fabric)["tiers"]}
    assert tiers[1]["oversubscription"] == 3.0


def test_generate_to_another_format_and_stdout(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, err = run(capsys, "generate", "fat-tree-2tier", "hosts=8", "radix=8", "--to", "slurm")
    assert code == 0
    assert out.startswith("# Slurm topology.conf") and "-> stdout (slurm)" in err


def test_generate_to_a_yaml_file_writes_native_yaml(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = generate(capsys, tmp_path / "torus.yaml", "torus_3d", "x=2", "y=2", "z=1")
    assert path.read_text().startswith("format: ibpool.topology")
    assert show_json(capsys, path)["hosts"] == 4


# -------------------------------------------------------------------------------------- diff


def test_diff_lists_the_changes(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    old = generate(capsys, tmp_path / "old.json", "fat_tree_2tier", "hosts=24", "radix=8")
    document = json.loads(old.read_text())
    topology = document["topology"]
    topology["links"][0]["speed"] = "HDR"  # changed
    removed = topology["links"].pop(-1)  # removed
    topology["switches"][0]["name"] = "renamed"  # switch changed
    topology["hosts"][1]["gpus"] = topology["hosts"][1]["gpus"][:4]  # host changed
    new = tmp_path / "new.json"
    new.write_text(json.dumps(document))

    code, out, _ = run(capsys, "diff", old, new)
    assert code == 0
    assert "links changed (1):" in out and "speed NDR -> HDR" in out
    assert "links removed (1):" in out and f":{removed['a'][1]}" in out
    assert "switches changed (1):" in out and "name leaf001 -> renamed" in out
    assert "hosts changed (1):" in out and "node002: gpus 8 x" in out
    assert "summary: hosts +0 -0 ~1; switches +0 -0 ~1; links +0 -1 ~1" in out

    code, out, _ = run(capsys, "diff", old, new, "--format", "json")
    report = json.loads(out)
    assert code == 0 and report["same"] is False and len(report["diff"]["links_removed"]) == 1

    code, out, _ = run(capsys, "diff", old, old)
    assert code == 0 and "no differences" in out


def test_diff_added_hosts_across_formats(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    small = generate(capsys, tmp_path / "small.conf", "fat_tree_2tier", "hosts=10", "radix=8", "--to", "slurm")
    big = generate(capsys, tmp_path / "big.conf", "fat_tree_2tier", "hosts=12", "radix=8", "--to", "slurm")
    code, out, _ = run(capsys, "diff", small, big)
    assert code == 0 and "hosts added (2): node[011-012]" in out


# -------------------------------------------------------------------------------- bad input


def test_empty_file_is_an_input_error(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    empty = tmp_path / "empty.topo"
    empty.write_text("")
    cases: list[list[str | Path]] = [["show", empty], ["convert", "--from", "ibnetdiscover", empty, "--to", "slurm"]]
    for argv in cases:
        code, out, err = run(capsys, *argv)
        assert code == 2 and out == ""
        assert err.startswith(f"ibpool topo: {empty}:1: empty file")


def test_truncated_dump_names_file_and_line(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    text = need("fabrics/psmn-x5/X5.topofile").read_text()
    cut = tmp_path / "cut.topo"
    cut.write_text(text[: len(text) // 2])
    code, _, err = run(capsys, "show", cut)
    assert code == 2
    assert re.match(rf"ibpool topo: {re.escape(str(cut))}:\d+: truncated dump", err), err


def test_bad_inputs_exit_2_with_a_message(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    binary = tmp_path / "binary"
    binary.write_bytes(b"\x7fELF\x02\x01\x01\x00\xff\xfe\x00")
    bad_json = tmp_path / "bad.json"
    bad_json.write_text('{"format": "ibpool.topology", "version": 1, "topology": {')
    cycle = tmp_path / "cycle.conf"
    cycle.write_text("SwitchName=a Switches=b\nSwitchName=b Switches=a\nSwitchName=c Nodes=n1\n")
    cases: list[tuple[list[str | Path], str]] = [
        (["show", tmp_path / "missing.topo"], "No such file"),
        (["show", binary], "not UTF-8 text"),
        (["show", bad_json], f"{bad_json}:"),
        (["convert", cycle, "--to", "native"], f"{cycle}:"),
        (["generate", "fat_tree_2tier", "hosts=5000", "radix=8"], "fat_tree_2tier hosts=5000 radix=8: "),
        (["generate", "torus_3d", "x=2", "y=2", "z=0"], "torus dimensions must be >= 1"),
    ]
    for argv, message in cases:
        code, out, err = run(capsys, *argv)
        assert code == 2, (argv, err)
        assert err.startswith("ibpool topo: ") and message in err, (argv, err)
        assert err.count("\n") == 1 and out == "", err


def test_usage_errors_exit_1(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    fabric = generate(capsys, tmp_path / "f.json", "single_switch", "hosts=2")
    cases: list[tuple[list[str | Path], str]] = [
        ([], "required: COMMAND"),
        (["convert", "--from", "bogus", fabric, "--to", "slurm"], "invalid choice: 'bogus'"),
        (["convert", fabric], "required: --to"),
        (["convert", fabric, "--to", "nope"], "invalid choice: 'nope'"),
        (["show", fabric, "--bogus"], "unrecognized arguments: --bogus"),
        (["show", fabric, "--names", fabric], "--names applies to ibnetdiscover input"),
        (["convert", fabric, "--to", "slurm", "--nodes", "node[1-"], "bad hostlist"),
        (["diff", "-", "-"], "only one of OLD and NEW"),
        (["generate", "no_such_kind"], "invalid choice: 'no_such_kind'"),
        (["generate", "fat_tree_2tier", "hosts=8", "bogus=1"], "fat_tree_2tier has no parameter 'bogus'"),
        (["generate", "fat_tree_2tier", "hosts"], "'hosts' is not key=value"),
        (["generate", "torus_3d", "x=2"], "torus_3d needs y=, z="),
    ]
    for argv, message in cases:
        code, out, err = run(capsys, *argv)
        assert code == 1, (argv, err)
        assert message in err, (argv, err)
        assert out == ""


@pytest.mark.parametrize("command", ["convert", "show", "diff", "generate"])
def test_help_has_examples(capsys: pytest.CaptureFixture[str], command: str) -> None:
    code, out, _ = run(capsys, command, "--help")
    assert code == 0
    assert "examples:" in out and f"ibpool topo {command}" in out and "exit codes" in out


def test_as_a_subprocess_exit_codes_and_no_traceback(tmp_path: Path) -> None:
    def cli(*argv: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-m", "ibpool_cli", "topo", *argv], capture_output=True, text=True, timeout=60, check=False
        )

    fabric = tmp_path / "f.json"
    done = cli("generate", "fat_tree_2tier", "hosts=8", "radix=8", "-o", str(fabric))
    assert done.returncode == 0 and done.stderr.startswith("generated fat-tree-2tier-8: 8 hosts")
    done = cli("show", str(fabric), "--tree")
    assert done.returncode == 0 and "leaf001" in done.stdout
    (tmp_path / "empty").write_text("")
    done = cli("show", str(tmp_path / "empty"))
    assert done.returncode == 2 and "empty file" in done.stderr and "Traceback" not in done.stderr
    done = cli("show")
    assert done.returncode == 1 and "Traceback" not in done.stderr


def test_guess_format() -> None:
    assert guess_format("x.topo", "#\n# Topology file\nswitchguid=0x1\n") == "ibnetdiscover"
    assert guess_format("topology.conf", "SwitchName=s1 Nodes=n[1-2]\n") == "slurm"
    assert guess_format("topology.conf", "BlockName=b1 Nodes=n[1-2]\n") == "slurm"
    assert guess_format("-", '{"format":"ibpool.topology","version":1}') == "native"
    assert guess_format("f.yaml", "anything: 1\n") == "native"
    assert guess_format("-", "---\nkind: HyperNode\n") == "volcano"
    assert guess_format("-", '{"kind":"List","items":[{"kind":"Node"}]}') == "k8s-labels"


def test_x5_leaf_groups_survive_every_cli_round_trip(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    dump, names = need("fabrics/psmn-x5/X5.topofile"), need("fabrics/psmn-x5/X5.map")
    native = tmp_path / "x5.json"
    code, _, _ = run(capsys, "convert", dump, "--names", names, "--to", "native", "-o", native)
    assert code == 0

    def groups(topology: Topology) -> set[frozenset[str]]:  # lower case, as Kubernetes node names are
        return {frozenset(h.lower() for h in g) for g in leaf_groups(build_hierarchy(topology))}

    reference = groups(import_topology("native", native.read_text(), file="x5.json"))
    for fmt in ("slurm", "slurm-block", "k8s-labels", "volcano"):
        out = tmp_path / f"x5.{fmt}"
        code, _, err = run(capsys, "convert", native, "--to", fmt, "-o", out)
        assert code == 0, err
        back = import_topology(guess_format(str(out), out.read_text()), out.read_text(), file=out.name)
        assert groups(back) == reference, fmt


def test_show_counts_hosts_whose_one_adapter_has_no_rail_apart(capsys: pytest.CaptureFixture[str]) -> None:
    dump = need("fabrics/ibtopotool/3.topo")  # one host with HCA-1 and HCA-2, four with one adapter each
    summary = show_json(capsys, dump)
    assert summary["rails"] == [{"rail": 0, "hosts": 1}, {"rail": 1, "hosts": 1}]
    assert summary["hosts_without_rail"] == 4 and summary["hosts_by_rail_count"] == [{"rails": 2, "hosts": 1}]
    code, out, _ = run(capsys, "show", dump)
    assert code == 0 and "4 host(s) with one adapter and no" in out


def test_rails_applies_to_ibnetdiscover_input_only(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    conf = tmp_path / "t.conf"
    conf.write_text("SwitchName=a Nodes=n1\n")
    code, _, err = run(capsys, "convert", conf, "--to", "native", "--rails", "mlx5_0,mlx5_3")
    assert code == 1 and "--rails applies to ibnetdiscover input" in err
    code, _, err = run(capsys, "show", need("fabrics/ibtopotool/3.topo"), "--rails", "mlx5_0,,mlx5_0")
    assert code == 1 and "adapter names in rail order, each once" in err
