"""`ibnetdiscover` output (infiniband-diags) to a Topology, and a Topology back to that text.

Read: the default topology-file form (node sections: `switchguid=`/`caguid=`/`rtguid=`, a
`Switch|Ca|Rt N "id" # "description"` line, then one `[port] "remote-id"[remote-port] ... 4xQDR`
line per cabled port), the same form as ibsim writes it (`Hca` nodes, names instead of GUIDs,
optional `w=`), and the `-p` ports report (`SW lid port 0xguid 4x QDR - CA lid port 0xguid ...`).

- Switches: GUID, name (the `S-<guid>` id, the host name of a managed switch description
  `MF0;name:model/U1`, or the name map's), radix = port count from the dump, model = description.
- Channel adapters are grouped into hosts by description: "node01 mlx5_0" is CA `mlx5_0` of host
  `node01`. A host with several CAs gets each one's rail from its own number (mlx5_N -> N, HCA-N
  -> N - 1), so a missing adapter shifts no other; where names give no number, by GUID order, and
  `rails=` (adapter names in rail order) overrides both (`adapter_rails`). A CA whose description
  is a generic adapter name ("MT25408 ConnectX Mellanox Technologies") is a host of its own named
  `H-<guid>` (as ibnetdiscover shows it), unless the name map names it; one warning gives their
  count. The host-level exports leave such hosts out (`model.unnamed_host`).
- "Mellanox Technologies Aggregation Node" CAs (SHARP, on Quantum-class switches) mark the switch
  they hang off as SHARP-capable and are never hosts; their virtual port is not counted in radix.
- Every link appears twice (from each end): the two sightings are merged; ends that disagree are
  an error, rates that disagree a warning (the slower is kept). Self-looped switch ports and
  discovery errors printed into the dump (`umad ... timed out`) are warnings.
- Errors (`FormatError`, "FILE:LINE: reason"): empty input, truncated dump, link to a node the dump
  never defines, duplicated GUID, port beyond the node's port count, unreadable node or port line.
"""

from __future__ import annotations

import heapq
import re
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field

from ..graph import Graph
from ..model import (
    LANE_GBPS,
    WIDTHS,
    Ca,
    FabricError,
    Host,
    Link,
    PortRef,
    Router,
    Switch,
    Topology,
    build_topology,
    normalize_guid,
)
from .diagnostics import Exported, FormatError, synthetic_guid, where
from .hierarchy import subset_topology

__all__ = [
    "adapter_rails",
    "export_ibnetdiscover",
    "import_ibnetdiscover",
    "is_generic_description",
    "parse_name_map",
    "rail_number",
]

_ID_LINE = re.compile(r"^(vendid|devid|sysimgguid|switchguid|caguid|rtguid)\s*=\s*(?:0x)?([0-9a-fA-F]+)")
_NODE_LINE = re.compile(r'^(Switch|Ca|Hca|Rt|Router)\s+(\d+)\s+"([^"]*)"(.*)$')
_PORT_LINE = re.compile(
    r'^\[(\d+)\](?:\[ext \d+\])?(?:\(([0-9a-fA-F]+)\))?\s*"([^"]+)"\[(\d+)\](?:\[ext \d+\])?'
    r"(?:\s*\(([0-9a-fA-F]+)\))?(.*)$"
)
_PORTS_FORM = re.compile(
    r"^(SW|CA|RT)\s+(\d+)\s+(\d+)\s+0x([0-9a-fA-F]+)\s+(\S+)\s+(\S+)"
    r"(?:\s+-\s+(SW|CA|RT)\s+(\d+)\s+(\d+)\s+0x([0-9a-fA-F]+)\s+\(\s*'(.*)'\s+-\s+'(.*)'\s*\)|\s+'(.*)')?\s*$"
)
_RATE = re.compile(r"(?<!\S)(\d+|\?+)x(\S+)")
_IGNORED = re.compile(r"^(Chassis\s+\d+|Non-Chassis Nodes|Hostname:)")
_DISCOVERY_ERROR = re.compile(r"umad|ibwarn|timed out|bad status|^ibnetdiscover:|^src/\S+:\d+", re.I)
_IBSIM_DIRECTIVE = re.compile(r"^(include|do)\s")
_GENERIC = re.compile(
    r"^\s*$|^MT\d+\b|Mellanox Technologies|InfiniHost|ConnectX|^[SHR]-[0-9a-fA-F]{16}$|^(0x)?[0-9a-fA-F]{16}$"
    r"|^localhost\b|^\(null\)",
    re.I,
)
_AGGREGATION_NODE = re.compile(r"Aggregation Node", re.I)
_MANAGED_SWITCH = re.compile(r"^MF0;([^:;\s]+):([^/;]+)")
_IDENT_GUID = re.compile(r"^[SHR]-([0-9a-fA-F]{1,16})$")  # ibnetdiscover's node ids: S-<guid>, H-..., R-...
_RAIL_NAME = re.compile(r"^(?:mlx\d+_(\d+)|HCA-([1-9]\d*))$", re.I)
_KINDS = {"Switch": "switch", "Ca": "ca", "Hca": "ca", "Rt": "router", "Router": "router"}
_PORTS_KINDS = {"SW": "switch", "CA": "ca", "RT": "router"}
_PREFIX = {"switch": "S", "ca": "H", "router": "R"}
_IBSIM_SPEEDS = {1: "SDR", 2: "DDR", 4: "QDR", 8: "FDR10", 16: "FDR", 32: "EDR", 64: "HDR", 128: "NDR"}


def is_generic_description(description: str) -> bool:
    """True for adapter descriptions that name no host ("MT25408 ConnectX Mellanox Technologies")."""
    return bool(_GENERIC.search(description))


def parse_name_map(text: str, *, file: str = "<names>") -> dict[str, str]:
    """A GUID -> name map: `H-0002c90300080e84 r510gluster1`, `0x0002c90300080e84 "node01"` or bare GUIDs.

    Keys come back normalised (`0x` + 16 hex digits); `#` starts a comment line.
    """
    out: dict[str, str] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        parts = line.split(None, 1)
        if len(parts) != 2:
            raise FormatError(file, number, f"expected 'GUID name', got {line[:80]!r}")
        key, value = parts
        value = value.strip()
        if value.startswith('"'):
            end = value.rfind('"')
            value = value[1:end] if end > 0 else value[1:]
        value = value.strip()
        try:
            guid = _map_key(key)
        except FabricError:
            reason = f"{key!r} is not a GUID (like 0x0002c90300080e84 or H-0002c90300080e84)"
            raise FormatError(file, number, reason) from None
        if not value:
            raise FormatError(file, number, f"no name given for {key}")
        out[guid] = value
    return out


def _map_key(key: str) -> str:
    match = _IDENT_GUID.match(key)
    try:
        return normalize_guid(match[1] if match else key)
    except ValueError:
        raise FabricError(f"{key!r} is not a GUID") from None


def _guid(text: str, file: str, line: int) -> str:
    try:
        return normalize_guid(text)
    except FabricError:
        raise FormatError(file, line, f"GUID {text} is longer than 64 bits") from None


@dataclass
class _Entry:
    port: int
    remote: str
    rport: int
    width: int | None
    speed: str | None
    line: int


@dataclass
class _Node:
    kind: str
    ident: str
    guid: str
    ports: int
    desc: str
    line: int
    entries: list[_Entry] = field(default_factory=list)


@dataclass
class _LinkRecord:
    a: PortRef
    b: PortRef
    width: int | None
    speed: str | None
    line: int
    seen: int = 1


class _Reader:
    def __init__(self, file: str, warnings: list[str]) -> None:
        self.file = file
        self.warnings = warnings
        self.unknown_speed_tokens: set[str] = set()

    def warn(self, line: int | None, message: str) -> None:
        self.warnings.append(where(self.file, line, message))

    def rate(self, width_token: str, speed_token: str, line: int) -> tuple[int | None, str | None]:
        width = int(width_token) if width_token.isdigit() else None
        if width is not None and width not in WIDTHS:
            self.warn(line, f"link width {width}x is not one of {WIDTHS}; ignored")
            width = None
        speed: str | None = speed_token.upper()
        if speed not in LANE_GBPS:
            if speed and not set(speed) <= {"?"} and speed not in self.unknown_speed_tokens:
                self.unknown_speed_tokens.add(speed)
                self.warn(line, f"unknown link speed {speed_token!r}; known: {', '.join(LANE_GBPS)}")
            speed = None
        return width, speed


def _guid16(guid: str) -> str:
    return guid.removeprefix("0x")


def _ident_guid(ident: str) -> str | None:
    match = _IDENT_GUID.match(ident)
    return normalize_guid(match[1]) if match else None


def _parse_standard(lines: list[str], reader: _Reader, ends_with_newline: bool) -> list[_Node]:
    file = reader.file
    nodes: list[_Node] = []
    pending: dict[str, str] = {}
    pending_line = 0
    current: _Node | None = None
    seen_ports: dict[int, int] = {}
    last = max((i for i, raw in enumerate(lines, 1) if raw.strip()), default=0)
    for number, raw in enumerate(lines, 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        port_match = _PORT_LINE.match(line)
        if port_match:
            if current is None:
                raise FormatError(file, number, "port line outside a node section (no Switch/Ca line before it)")
            port, remote, rport = int(port_match[1]), port_match[3], int(port_match[4])
            rest = port_match[6]
            if not 1 <= port <= current.ports:
                raise FormatError(file, number, f"port {port} is beyond the {current.ports} ports of {current.ident}")
            if port in seen_ports:
                raise FormatError(
                    file, number, f"port {port} of {current.ident} is listed twice (first at line {seen_ports[port]})"
                )
            seen_ports[port] = number
            width: int | None = None
            speed: str | None = None
            if "#" in rest:
                comment = rest.split("#", 1)[1]
                tail = comment[comment.rfind('"') + 1 :] if '"' in comment else comment
                rates = _RATE.findall(tail)
                if rates:
                    width, speed = reader.rate(rates[-1][0], rates[-1][1], number)
                elif number == last and not ends_with_newline:
                    raise FormatError(file, number, "truncated dump: the last line is cut short (no link rate)")
            else:  # ibsim: optional w=(1|4|12) and s=<ibsim speed code>
                w = re.search(r"\bw=(\d+)", rest)
                s = re.search(r"\bs=(\d+)", rest)
                if w:
                    width, _ = reader.rate(w[1], "?", number)
                if s:
                    speed = _IBSIM_SPEEDS.get(int(s[1]))
            current.entries.append(_Entry(port, remote, rport, width, speed, number))
            continue
        node_match = _NODE_LINE.match(line)
        if node_match:
            kind = _KINDS[node_match[1]]
            ports, ident, rest = int(node_match[2]), node_match[3], node_match[4].strip()
            if ports < 1:
                raise FormatError(file, number, f"{ident} has {ports} ports")
            desc = ""
            if rest.startswith("#"):
                quoted = re.match(r'^"(.*)"', rest[1:].strip())
                desc = quoted[1].strip() if quoted else ""
            given = pending.get({"switch": "switchguid", "ca": "caguid", "router": "rtguid"}[kind])
            given = given or pending.get("switchguid") or pending.get("caguid") or pending.get("rtguid")
            guid = _guid(given, file, number) if given else _ident_guid(ident) or synthetic_guid(kind, ident)
            current = _Node(kind, ident, guid, ports, desc, number)
            nodes.append(current)
            seen_ports = {}
            pending = {}
            continue
        id_match = _ID_LINE.match(line)
        if id_match:
            if not pending:
                pending_line = number
            pending[id_match[1]] = id_match[2]
            continue
        if _IGNORED.match(line):
            continue
        if _DISCOVERY_ERROR.search(line):
            reader.warn(number, f"the discovery reported an error, the dump may miss part of the fabric: {line[:120]}")
            continue
        if _IBSIM_DIRECTIVE.match(line):
            reader.warn(number, f"ibsim directive not followed: {line[:80]}")
            continue
        if number == last:
            raise FormatError(file, number, f"truncated dump: the last line is incomplete: {line[:80]!r}")
        if line.startswith("[") or line.split()[0] in _KINDS:
            raise FormatError(file, number, f"cannot read this line: {line[:80]!r}")
        reader.warn(number, f"line ignored: {line[:80]!r}")
    if pending:
        raise FormatError(file, pending_line, "truncated dump: a node header is not followed by its node line")
    if nodes and not nodes[-1].entries:  # also a dump of one node: a node line is followed by its ports
        raise FormatError(
            file, nodes[-1].line, f"truncated dump: the last node {nodes[-1].ident} has no port lines after it"
        )
    return nodes


def _parse_ports_form(lines: list[str], reader: _Reader) -> list[_Node]:
    """`ibnetdiscover -p`: one line per port. Switch ports share the switch GUID; CA ports each have
    their own GUID, so CA ports with the same (non-generic) description are taken as one CA."""
    file = reader.file
    last = max((i for i, raw in enumerate(lines, 1) if raw.strip()), default=0)
    rows: list[tuple[int, re.Match[str]]] = []
    for number, raw in enumerate(lines, 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        match = _PORTS_FORM.match(line)
        if match:
            rows.append((number, match))
            continue
        if _DISCOVERY_ERROR.search(line):
            reader.warn(number, f"the discovery reported an error, the dump may miss part of the fabric: {line[:120]}")
            continue
        if number == last:
            raise FormatError(file, number, f"truncated dump: the last line is incomplete: {line[:80]!r}")
        raise FormatError(file, number, f"cannot read this line of a ports report: {line[:80]!r}")
    # pass 1: which node each local port belongs to
    nodes: dict[str, _Node] = {}
    order: list[_Node] = []
    port_owner: dict[str, tuple[str, int]] = {}  # CA/router port GUID -> (node ident, port)
    ca_groups: dict[tuple[str, str, str], str] = {}
    seen: dict[tuple[str, int], int] = {}
    for number, m in rows:
        kind, port, guid = _PORTS_KINDS[m[1]], int(m[3]), _guid(m[4], file, number)
        desc = (m[11] if m[11] is not None else m[13] or "").strip()
        if kind == "switch":
            ident = f"S-{_guid16(guid)}"
        else:
            group = (kind, "desc", desc) if desc and not is_generic_description(desc) else (kind, "guid", guid)
            ident = ca_groups.setdefault(group, f"{_PREFIX[kind]}-{_guid16(guid)}")
            if guid in port_owner and port_owner[guid] != (ident, port):
                raise FormatError(file, number, f"duplicated GUID {guid} (port {port} of {ident})")
            port_owner[guid] = (ident, port)
        node = nodes.get(ident)
        if node is None:
            node = _Node(kind, ident, _ident_guid(ident) or guid, port, desc, number)
            nodes[ident] = node
            order.append(node)
        elif node.kind != kind:
            raise FormatError(file, number, f"duplicated GUID {guid}: a {node.kind} at line {node.line}, a {kind} here")
        if (ident, port) in seen:
            raise FormatError(
                file, number, f"port {port} of {ident} is listed twice (first at line {seen[ident, port]})"
            )
        seen[ident, port] = number
        node.ports = max(node.ports, port)
    switch_guids = {n.guid for n in order if n.kind == "switch"}
    for guid in port_owner:
        if guid in switch_guids:
            raise FormatError(file, seen[port_owner[guid]], f"duplicated GUID {guid}: both a switch and an adapter")
    # pass 2: the links, by the remote port's GUID
    for number, m in rows:
        if m[7] is None:
            continue
        kind, port, guid = _PORTS_KINDS[m[1]], int(m[3]), normalize_guid(m[4])
        ident = f"S-{_guid16(guid)}" if kind == "switch" else port_owner[guid][0]
        rkind, rport, rguid = _PORTS_KINDS[m[7]], int(m[9]), _guid(m[10], file, number)
        if rkind == "switch":
            remote = f"S-{_guid16(rguid)}"
        elif rguid in port_owner:
            remote, rport = port_owner[rguid]
        else:
            remote = f"{_PREFIX[rkind]}-{_guid16(rguid)}"
        width, speed = reader.rate(m[5].removesuffix("x"), m[6], number)
        nodes[ident].entries.append(_Entry(port, remote, rport, width, speed, number))
    return order


def _assemble(
    nodes: list[_Node],
    reader: _Reader,
    *,
    name: str,
    names: Mapping[str, str],
    default_speed: str,
    truncated_hint: bool,
    rail_order: Sequence[str] | None,
) -> Topology:
    file = reader.file
    by_ident: dict[str, _Node] = {}
    by_guid: dict[str, _Node] = {}
    for node in nodes:
        if node.ident in by_ident:
            raise FormatError(
                file, node.line, f"{node.ident} is defined twice (first at line {by_ident[node.ident].line})"
            )
        if node.guid in by_guid:
            first = by_guid[node.guid]
            raise FormatError(
                file, node.line, f"duplicated GUID {node.guid} ({node.ident}; {first.ident} at line {first.line})"
            )
        by_ident[node.ident] = node
        by_guid[node.guid] = node
    links: dict[tuple[PortRef, PortRef], _LinkRecord] = {}
    port_link: dict[PortRef, tuple[tuple[PortRef, PortRef], int]] = {}

    def port_name(ref: PortRef) -> str:
        return f"{by_guid[ref.guid].ident}[{ref.port}]"

    for node in nodes:
        loops: set[tuple[int, int]] = set()
        for entry in node.entries:
            remote = by_ident.get(entry.remote)
            if remote is None:
                hint = " (the dump looks truncated)" if truncated_hint else ""
                raise FormatError(
                    file, entry.line, f'link to unknown node "{entry.remote}": the dump never defines it{hint}'
                )
            if not 1 <= entry.rport <= remote.ports:
                raise FormatError(
                    file, entry.line, f"port {entry.rport} is beyond the {remote.ports} ports of {remote.ident}"
                )
            if remote is node:
                loops.add((min(entry.port, entry.rport), max(entry.port, entry.rport)))
                continue
            here, there = PortRef(node.guid, entry.port), PortRef(remote.guid, entry.rport)
            key = (here, there) if here <= there else (there, here)
            for end, other in ((here, there), (there, here)):
                previous = port_link.get(end)
                if previous is not None and previous[0] != key:
                    elsewhere = previous[0][1] if previous[0][0] == end else previous[0][0]
                    raise FormatError(
                        file,
                        entry.line,
                        f"{port_name(end)} is cabled to {port_name(other)} here "
                        f"but to {port_name(elsewhere)} at line {previous[1]}",
                    )
            record = links.get(key)
            if record is None:
                links[key] = _LinkRecord(here, there, entry.width, entry.speed, entry.line)
                port_link[here] = port_link[there] = (key, entry.line)
                continue
            record.seen += 1
            if record.width is None or record.speed is None:
                record.width = record.width or entry.width
                record.speed = record.speed or entry.speed
            elif (
                entry.width is not None
                and entry.speed is not None
                and (entry.width, entry.speed)
                != (
                    record.width,
                    record.speed,
                )
            ):
                slower = min(
                    ((record.width, record.speed), (entry.width, entry.speed)), key=lambda r: r[0] * LANE_GBPS[r[1]]
                )
                reader.warn(
                    entry.line,
                    f"link {port_name(here)} - {port_name(there)} is {entry.width}x{entry.speed} here but "
                    f"{record.width}x{record.speed} at line {record.line}; kept {slower[0]}x{slower[1]}",
                )
                record.width, record.speed = slower
        if loops:
            pairs = ", ".join(f"{p}-{q}" for p, q in sorted(loops))
            reader.warn(node.line, f"{node.ident} has self-looped ports ({pairs}); left out of the model")
    # SHARP aggregation nodes: mark their switch, drop them
    aggregation = {n.guid for n in nodes if n.kind == "ca" and _AGGREGATION_NODE.search(n.desc)}
    sharp: set[str] = set()
    virtual_port: set[tuple[str, int]] = set()
    for key in list(links):
        a, b = key
        if a.guid in aggregation or b.guid in aggregation:
            sw_end = b if a.guid in aggregation else a
            if by_guid[sw_end.guid].kind == "switch":
                sharp.add(sw_end.guid)
                virtual_port.add((sw_end.guid, sw_end.port))
            del links[key]
    switches: list[Switch] = []
    routers: list[Router] = []
    ca_nodes: list[_Node] = []
    for node in nodes:
        mapped = names.get(node.guid)
        if node.kind == "switch":
            radix = node.ports
            if (node.guid, node.ports) in virtual_port:
                radix -= 1  # the aggregation node's port is virtual
            managed = _MANAGED_SWITCH.match(node.desc)
            switch_name = mapped or (managed[1] if managed else node.ident)
            model = managed[2].strip() if managed else node.desc or None
            switches.append(
                Switch(guid=node.guid, name=switch_name, radix=radix, sharp=node.guid in sharp, model=model)
            )
        elif node.kind == "router":
            routers.append(Router(guid=node.guid, name=mapped or node.ident, radix=node.ports))
        elif node.guid not in aggregation:
            ca_nodes.append(node)
    if not switches:
        reader.warn(None, "no switches in the dump: the topology is empty")
        return Topology(name=name, warnings=reader.warnings)
    cas: list[Ca] = []
    by_host: dict[str, list[tuple[str, _Node]]] = {}
    generic: list[tuple[_Node, str]] = []
    for node in ca_nodes:
        mapped = names.get(node.guid)
        description = mapped or node.desc or node.ident
        if not mapped and is_generic_description(description):
            host, ca_name = f"H-{_guid16(node.guid)}", ""
            generic.append((node, description))
        else:
            host, _, ca_name = description.strip().partition(" ")
            ca_name = ca_name.strip()
        by_host.setdefault(host, []).append((ca_name, node))
    if generic:
        first, description = generic[0]
        reader.warn(
            first.line,
            f"{len(generic)} adapter(s) name no host (a generic description, first this one's "
            f'"{description}"): each is a host H-<guid>; a GUID -> name map (--names MAPFILE) names them',
        )
    by_guid_order = 0
    for host, members in by_host.items():
        rails: dict[str, int | None] = {}
        if len(members) > 1:
            rails, numbered = adapter_rails([(ca_name, node.guid) for ca_name, node in members], rail_order)
            by_guid_order += not numbered
        for ca_name, node in members:
            cas.append(Ca(guid=node.guid, host=host, name=ca_name, ports=node.ports, rail=rails.get(node.guid)))
    if by_guid_order:
        reader.warn(
            None,
            f"{by_guid_order} host(s) have adapters whose names give no rail number (mlx5_N, HCA-N) or give one "
            "twice: their rails follow their adapters' GUID order (--rails NAMES lists adapter names in rail order)",
        )
    missing_rate = 0
    model_links: list[Link] = []
    for record in links.values():
        if record.seen == 1:
            reader.warn(
                record.line,
                f"link {port_name(record.a)} - {port_name(record.b)} is listed from one side only",
            )
        if record.width is None or record.speed is None:
            missing_rate += 1
        model_links.append(Link(a=record.a, b=record.b, width=record.width or 4, speed=record.speed or default_speed))
    if missing_rate:
        reader.warn(None, f"{missing_rate} link(s) have no rate in the dump; taken as 4x{default_speed}")
    try:
        return build_topology(
            name=name,
            hosts=[Host(name=h) for h in by_host],
            cas=cas,
            switches=switches,
            routers=routers,
            links=model_links,
            warnings=reader.warnings,
        )
    except FabricError as error:  # the checks above should have caught it; say where anyway
        raise FormatError(file, None, str(error)) from None


def rail_number(ca_name: str) -> int | None:
    """The rail an adapter's own name gives: `mlx5_N` (and `mlx4_N`...) -> N, `HCA-N` -> N - 1 (HCA-1
    is the first); None for other names."""
    match = _RAIL_NAME.match(ca_name)
    if match is None:
        return None
    return int(match[1]) if match[1] is not None else int(match[2]) - 1


def adapter_rails(
    adapters: Sequence[tuple[str, str]], rail_order: Sequence[str] | None = None
) -> tuple[dict[str, int | None], bool]:
    """Rails of one host's adapters, given as (name, GUID): GUID -> rail, and whether the names gave them.

    With `rail_order` (adapter names in rail order, `--rails`) an adapter's rail is its name's
    position there, and an adapter not listed has none. Otherwise each adapter's rail is the number
    in its name (`rail_number`), so a host missing HCA-2 keeps HCA-3 on the third rail like every
    other host; when a name gives no number or two adapters give the same one, the host's rails
    follow its adapters' GUID order instead (False is returned)."""
    if rail_order is not None:
        position = {name: i for i, name in enumerate(rail_order)}
        return {guid: position.get(name) for name, guid in adapters}, True
    numbers = [rail_number(name) for name, _ in adapters]
    if None not in numbers and len(set(numbers)) == len(numbers):
        return {guid: n for (_, guid), n in zip(adapters, numbers, strict=True)}, True
    return {guid: i for i, guid in enumerate(sorted(guid for _, guid in adapters))}, False


def import_ibnetdiscover(
    text: str,
    *,
    file: str = "<ibnetdiscover>",
    names: Mapping[str, str] | None = None,
    name: str = "fabric",
    default_speed: str = "SDR",
    rails: Sequence[str] | None = None,
) -> Topology:
    """The topology in `ibnetdiscover` output (`text`); warnings land in `Topology.warnings`.

    `names` maps node GUIDs (any form: `0x...`, bare hex, `H-...`) to host or switch names, like
    ibnetdiscover's node-name map; see `parse_name_map`. `rails` lists adapter names in rail order
    (`mlx5_0,mlx5_3,...`) where the names' own numbers are not the rails (`adapter_rails`). Links
    whose rate the dump omits (ibsim files) are taken as 4x`default_speed`. Raises `FormatError`
    ("FILE:LINE: reason") on bad input.
    """
    if default_speed not in LANE_GBPS:
        raise ValueError(f"default_speed {default_speed!r} is not one of {', '.join(LANE_GBPS)}")
    guid_names = {_map_key(k): v for k, v in (names or {}).items()}
    if not text.strip():
        raise FormatError(file, 1, "empty file: no ibnetdiscover output")
    lines = text.splitlines()
    warnings: list[str] = []
    reader = _Reader(file, warnings)
    first = next(
        (
            ln.strip()
            for ln in lines
            if ln.strip() and not ln.strip().startswith("#") and not _DISCOVERY_ERROR.search(ln)
        ),
        "",
    )
    if _PORTS_FORM.match(first):
        nodes = _parse_ports_form(lines, reader)
    else:
        nodes = _parse_standard(lines, reader, text.endswith("\n"))
    if not nodes:
        raise FormatError(file, len(lines), "no nodes found: is this ibnetdiscover output?")
    if not any(n.guid and _IDENT_GUID.match(n.ident) for n in nodes):
        reader.warn(None, "no GUIDs in the dump (ibsim-style names); GUIDs derived from the node names")
    return _assemble(
        nodes,
        reader,
        name=name,
        names=guid_names,
        default_speed=default_speed,
        rail_order=rails,
        truncated_hint=not text.endswith("\n"),
    )


def _switch_order(topology: Topology) -> list[Switch]:
    """Switches so that, for each cable between two switches, the section of its `a` end comes first
    (when the a -> b links have no cycle): the importer takes the first-seen end as `a`, so a tree's
    child -> parent orientation survives the round trip. Where a cycle blocks that, by tier."""
    by_guid = {s.guid: s for s in topology.switches}
    after: dict[str, set[str]] = {g: set() for g in by_guid}
    before = dict.fromkeys(by_guid, 0)
    for link in topology.links:
        a, b = link.a.guid, link.b.guid
        if a in by_guid and b in by_guid and a != b and b not in after[a]:
            after[a].add(b)
            before[b] += 1
    ready = [g for g, n in before.items() if n == 0]
    heapq.heapify(ready)
    order: list[str] = []
    while ready:
        guid = heapq.heappop(ready)
        order.append(guid)
        for nxt in after[guid]:
            before[nxt] -= 1
            if before[nxt] == 0:
                heapq.heappush(ready, nxt)
    if len(order) < len(by_guid):
        tiers = Graph(topology).tiers()
        placed = set(order)
        order += sorted((g for g in by_guid if g not in placed), key=lambda g: (tiers[g], g))
    return [by_guid[g] for g in order]


def export_ibnetdiscover(topology: Topology, *, nodes: Collection[str] | None = None) -> Exported:
    """The topology as `ibnetdiscover` would print it (default form), readable by `import_ibnetdiscover`.

    Host CAs are described "host caname"; a switch whose name is not its `S-<guid>` id gets the
    managed-switch description `MF0;name:model/U1`, so its name survives a round trip, and switch
    sections come in an order that keeps which end of a switch-to-switch cable is `a`. SHARP
    switches get their aggregation node on the port after the last. LIDs are made up (sequential).
    With `nodes`, only those hosts (every switch stays).
    """
    warnings: list[str] = []
    if nodes is not None:
        topology, warnings = subset_topology(topology, nodes)
    switches = {s.guid: s for s in _switch_order(topology)}
    cas = {c.guid: c for c in topology.cas}
    routers = {r.guid: r for r in topology.routers}
    ports: dict[str, dict[int, tuple[PortRef, Link]]] = {}
    for link in topology.links:
        ports.setdefault(link.a.guid, {})[link.a.port] = (link.b, link)
        ports.setdefault(link.b.guid, {})[link.b.port] = (link.a, link)
    lids: dict[str, int] = {}
    for guid in [*switches, *routers, *cas]:
        lids[guid] = len(lids) + 1
    aggregation: dict[str, str] = {}  # switch GUID -> its aggregation node's GUID
    taken = set(switches) | set(cas) | set(routers)
    for guid, switch in switches.items():
        if switch.sharp:
            an = synthetic_guid("aggregation-node", guid)
            while an in taken:
                an = synthetic_guid("aggregation-node", an)
            taken.add(an)
            aggregation[guid] = an
            lids[an] = len(lids) + 1

    def ident(guid: str) -> str:
        if guid in switches:
            return f'"S-{_guid16(guid)}"'
        if guid in routers:
            return f'"R-{_guid16(guid)}"'
        return f'"H-{_guid16(guid)}"'

    def description(guid: str) -> str:
        if guid in switches:
            s = switches[guid]
            if s.name == f"S-{_guid16(guid)}":
                return s.model or "switch"
            return f"MF0;{s.name}:{s.model or 'switch'}/U1"
        if guid in routers:
            return routers[guid].name
        if guid in cas:
            ca = cas[guid]
            return f"{ca.host} {ca.name}".strip()
        return "Mellanox Technologies Aggregation Node"

    def port_guid(guid: str, port: int) -> str:
        return f"{int(guid, 16) + port - 1:x}"

    out = ["#", f"# Topology file: generated by ibpool from topology {topology.name!r}", "#", ""]
    for guid, switch in switches.items():
        radix = switch.radix + (1 if guid in aggregation else 0)
        out += [
            f"switchguid={guid}({_guid16(guid).lstrip('0') or '0'})",
            f'Switch\t{radix} {ident(guid)}\t\t# "{description(guid)}" enhanced port 0 lid {lids[guid]} lmc 0',
        ]
        entries = dict(ports.get(guid, {}))
        for number in sorted(entries):
            remote, link = entries[number]
            rate = f"{link.width}x{link.speed}"
            if remote.guid in switches:
                out.append(
                    f'[{number}]\t{ident(remote.guid)}[{remote.port}]\t\t# "{description(remote.guid)}" '
                    f"lid {lids[remote.guid]} {rate}"
                )
            else:
                out.append(
                    f"[{number}]\t{ident(remote.guid)}[{remote.port}]({port_guid(remote.guid, remote.port)}) \t\t"
                    f'# "{description(remote.guid)}" lid {lids[remote.guid]} {rate}'
                )
        if guid in aggregation:
            an = aggregation[guid]
            out.append(
                f'[{radix}]\t"H-{_guid16(an)}"[1]({port_guid(an, 1)}) \t\t# "{description(an)}" lid {lids[an]} 4xNDR'
            )
        out.append("")
    adapters: list[tuple[str, str, int]] = [(g, "Rt", r.radix) for g, r in routers.items()]
    adapters += [(g, "Ca", c.ports) for g, c in cas.items()]
    for guid, kind, count in adapters:
        out += [
            f"{'rtguid' if kind == 'Rt' else 'caguid'}={guid}",
            f'{kind}\t{count} {ident(guid)}\t\t# "{description(guid)}"',
        ]
        for number in sorted(ports.get(guid, {})):
            remote, link = ports[guid][number]
            out.append(
                f"[{number}]({port_guid(guid, number)}) \t{ident(remote.guid)}[{remote.port}]\t\t"
                f'# lid {lids[guid]} lmc 0 "{description(remote.guid)}" '
                f"lid {lids[remote.guid]} {link.width}x{link.speed}"
            )
        out.append("")
    for switch_guid, an in aggregation.items():
        radix = switches[switch_guid].radix + 1
        out += [
            f"caguid={an}",
            f'Ca\t1 "H-{_guid16(an)}"\t\t# "{description(an)}"',
            f"[1]({port_guid(an, 1)}) \t{ident(switch_guid)}[{radix}]\t\t# lid {lids[an]} lmc 0 "
            f'"{description(switch_guid)}" lid {lids[switch_guid]} 4xNDR',
            "",
        ]
    return Exported("\n".join(out) + "\n", warnings)
