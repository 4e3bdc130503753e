"""The version rule: the code keeps the released contract, and the rule itself on synthetic types."""

from __future__ import annotations

import json
from pathlib import Path
from typing import ClassVar, Literal

import msgspec

from ibpool_proto import ALL_MESSAGES, Event
from ibpool_proto.compat import (
    dump_snapshot,
    latest_snapshot_path,
    load_snapshot,
    main,
    snapshot,
    violations,
)

THING_V1 = "io.ibpool.test.thing.happened.v1"
THING_V2 = "io.ibpool.test.thing.happened.v2"


def test_current_code_keeps_the_released_contract() -> None:
    path = latest_snapshot_path()
    assert path.exists(), "no released snapshot; run `python -m ibpool_proto.compat --write-snapshot`"
    found = violations(load_snapshot(path), ALL_MESSAGES)
    assert not found, (
        f"the message classes break the released contract ({path.name}):\n  "
        + "\n  ".join(found)
        + "\nAdd a new `.v<N+1>` type next to the old one instead (see docs/events/README.md)."
    )


def test_cli_check_passes() -> None:
    assert main([]) == 0


def test_snapshot_round_trips_through_json(tmp_path: Path) -> None:
    snap = snapshot(ALL_MESSAGES)
    path = tmp_path / "v1.json"
    path.write_text(dump_snapshot(snap))
    assert load_snapshot(path) == json.loads(json.dumps(snap))
    assert violations(load_snapshot(path), ALL_MESSAGES) == []


def test_latest_snapshot_is_the_highest_number(tmp_path: Path) -> None:
    assert latest_snapshot_path(tmp_path) == tmp_path / "v1.json"
    for n in (1, 2, 10):
        (tmp_path / f"v{n}.json").write_text("{}")
    (tmp_path / "notes.json").write_text("{}")
    assert latest_snapshot_path(tmp_path) == tmp_path / "v10.json"


# -- the rule on synthetic messages -----------------------------------------------------------


class Part(msgspec.Struct, frozen=True, kw_only=True):
    gpu_index: int
    label: str = ""


class Thing(Event, frozen=True, kw_only=True, tag=THING_V1):
    key_name: ClassVar[str] = "thing_id"
    summary: ClassVar[str] = "A thing happened."

    thing_id: str
    count: int
    parts: list[Part] = []
    colour: Literal["red", "green"] = "red"
    note: str = ""


RELEASED = snapshot([Thing])


# Nested Structs of the changed versions live here: annotations are resolved in module scope.
class PartMore(msgspec.Struct, frozen=True, kw_only=True):
    gpu_index: int
    label: str = ""
    milli: int = 1000


class PartRetyped(msgspec.Struct, frozen=True, kw_only=True):
    gpu_index: str
    label: str = ""


def check(*classes: type[Event]) -> list[str]:
    return violations(RELEASED, classes)


def test_unchanged_is_fine() -> None:
    assert check(Thing) == []


def test_added_optional_field_is_fine() -> None:
    class ThingMore(Event, frozen=True, kw_only=True, tag=THING_V1):
        key_name: ClassVar[str] = "thing_id"
        thing_id: str
        count: int
        parts: list[Part] = []
        colour: Literal["red", "green"] = "red"
        note: str = ""
        extra: str | None = None

    assert check(ThingMore) == []


def test_added_optional_field_in_nested_struct_is_fine() -> None:
    class ThingNested(Event, frozen=True, kw_only=True, tag=THING_V1):
        key_name: ClassVar[str] = "thing_id"
        thing_id: str
        count: int
        parts: list[PartMore] = []
        colour: Literal["red", "green"] = "red"
        note: str = ""

    assert check(ThingNested) == []


def test_giving_a_required_field_a_default_is_fine() -> None:
    class ThingDefault(Event, frozen=True, kw_only=True, tag=THING_V1):
        key_name: ClassVar[str] = "thing_id"
        thing_id: str
        count: int = 0
        parts: list[Part] = []
        colour: Literal["red", "green"] = "red"
        note: str = ""

    assert check(ThingDefault) == []


def test_added_required_field_is_a_violation() -> None:
    class ThingRequired(Event, frozen=True, kw_only=True, tag=THING_V1):
        key_name: ClassVar[str] = "thing_id"
        thing_id: str
        count: int
        owner: str
        parts: list[Part] = []
        colour: Literal["red", "green"] = "red"
        note: str = ""

    assert check(ThingRequired) == [f"{THING_V1}: required field 'owner' was added (give it a default)"]


def test_removed_field_is_a_violation() -> None:
    class ThingLess(Event, frozen=True, kw_only=True, tag=THING_V1):
        key_name: ClassVar[str] = "thing_id"
        thing_id: str
        count: int
        parts: list[Part] = []
        colour: Literal["red", "green"] = "red"

    assert check(ThingLess) == [f"{THING_V1}: field 'note' was removed"]


def test_retyped_field_is_a_violation() -> None:
    class ThingRetyped(Event, frozen=True, kw_only=True, tag=THING_V1):
        key_name: ClassVar[str] = "thing_id"
        thing_id: str
        count: float
        parts: list[Part] = []
        colour: Literal["red", "green"] = "red"
        note: str = ""

    found = check(ThingRetyped)
    assert len(found) == 1 and "field 'count' changed type" in found[0], found


def test_made_nullable_is_a_violation() -> None:
    class ThingNullable(Event, frozen=True, kw_only=True, tag=THING_V1):
        key_name: ClassVar[str] = "thing_id"
        thing_id: str
        count: int
        parts: list[Part] = []
        colour: Literal["red", "green"] = "red"
        note: str | None = ""

    found = check(ThingNullable)
    assert len(found) == 1 and "field 'note' changed type" in found[0], found


def test_new_enum_value_is_a_violation() -> None:
    class ThingColours(Event, frozen=True, kw_only=True, tag=THING_V1):
        key_name: ClassVar[str] = "thing_id"
        thing_id: str
        count: int
        parts: list[Part] = []
        colour: Literal["red", "green", "blue"] = "red"
        note: str = ""

    found = check(ThingColours)
    assert len(found) == 1 and "field 'colour' changed type" in found[0], found


def test_retyped_field_in_nested_struct_is_a_violation() -> None:
    class ThingNested(Event, frozen=True, kw_only=True, tag=THING_V1):
        key_name: ClassVar[str] = "thing_id"
        thing_id: str
        count: int
        parts: list[PartRetyped] = []
        colour: Literal["red", "green"] = "red"
        note: str = ""

    found = check(ThingNested)
    assert len(found) == 1 and "field 'parts[].gpu_index' changed type" in found[0], found


def test_optional_field_becoming_required_is_a_violation() -> None:
    class ThingStrict(Event, frozen=True, kw_only=True, tag=THING_V1):
        key_name: ClassVar[str] = "thing_id"
        thing_id: str
        count: int
        note: str
        parts: list[Part] = []
        colour: Literal["red", "green"] = "red"

    assert check(ThingStrict) == [f"{THING_V1}: field 'note' became required"]


def test_changed_subject_key_is_a_violation() -> None:
    class ThingRekeyed(Event, frozen=True, kw_only=True, tag=THING_V1):
        key_name: ClassVar[str] = "owner_id"
        thing_id: str
        count: int
        parts: list[Part] = []
        colour: Literal["red", "green"] = "red"
        note: str = ""

    assert check(ThingRekeyed) == [f"{THING_V1}: subject key changed from 'thing_id' to 'owner_id'"]


def test_removed_type_is_a_violation() -> None:
    found = check()
    assert len(found) == 1 and found[0].startswith(f"{THING_V1}: released type was removed"), found


def test_v2_next_to_v1_is_fine() -> None:
    class ThingV2(Event, frozen=True, kw_only=True, tag=THING_V2):
        key_name: ClassVar[str] = "thing_id"
        thing_id: str
        count: float  # retyped: that is what v2 is for
        owner: str  # a new required field
        colour: Literal["red", "green", "blue"] = "red"

    assert check(Thing, ThingV2) == []
    # ... and v2 alone is not: v1 must keep decoding while v2 ships.
    assert len(check(ThingV2)) == 1
