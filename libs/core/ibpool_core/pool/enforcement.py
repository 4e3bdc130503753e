"""What a grant tells the node agent to apply, so the holder cannot use more than it was granted.

One `Enforcement` per node of an allocation, from that node's shares:

- whole GPUs (and every host of a gang): `CUDA_VISIBLE_DEVICES` and `visible_devices` list the
  device UUIDs (UUIDs, not indices: CUDA and NVML may number the devices differently);
- a fraction of a GPU: the same, plus the MPS client limits `CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`
  (milli / 10) and `CUDA_MPS_PINNED_DEVICE_MEM_LIMIT` ("0=<MiB>M"), and the HAMi-core limits
  `CUDA_DEVICE_MEMORY_LIMIT_0` ("<MiB>m") and `CUDA_DEVICE_SM_LIMIT` (percent). The device
  ordinals in these variables are the ones the process sees, i.e. positions in
  `CUDA_VISIBLE_DEVICES`, so the granted GPU is always device 0;
- a MIG instance: `mig_instances` names the GPU instance to create, as "<gpu index>:<profile>@<start>"
  (profile as nvidia-smi prints it, start its placement in memory slices), with one compute
  instance spanning it. The agent learns the MIG device's UUID only once it exists, so it sets
  `CUDA_VISIBLE_DEVICES` itself;
- always `memory_limit_mib`: the GPU memory granted on the node, which the simulated agent
  enforces (work that needs more is killed as OOM).
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec

from ibpool_proto.pool import Enforcement

from .mig import MigInstance

WHOLE = 1000


class DeviceShare(msgspec.Struct, frozen=True, kw_only=True):
    """One GPU's granted share on the node that enforces it."""

    index: int
    uuid: str
    milli: int
    memory_mib: int
    mig: MigInstance | None = None


def enforcement_for(shares: Sequence[DeviceShare]) -> Enforcement:
    """The enforcement of one node's part of an allocation. `shares` are that node's GPUs."""
    ordered = sorted(shares, key=lambda s: s.index)
    memory = sum(s.memory_mib for s in ordered)
    instances = [format_mig_instance(s.index, s.mig) for s in ordered if s.mig is not None]
    if instances:
        return Enforcement(mig_instances=instances, memory_limit_mib=memory)
    uuids = [s.uuid for s in ordered]
    env = {"CUDA_VISIBLE_DEVICES": ",".join(uuids)}
    partial = [s for s in ordered if s.milli < WHOLE]
    if partial:
        # One SM limit covers every visible device, so a fractional grant holds exactly one GPU.
        share = partial[0]
        percent = str(max(1, share.milli // 10))
        env |= {
            "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": percent,
            "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": f"0={share.memory_mib}M",
            "CUDA_DEVICE_MEMORY_LIMIT_0": f"{share.memory_mib}m",
            "CUDA_DEVICE_SM_LIMIT": percent,
        }
    return Enforcement(env=env, visible_devices=uuids, memory_limit_mib=memory)


def format_mig_instance(gpu_index: int, instance: MigInstance) -> str:
    return f"{gpu_index}:{instance.profile}@{instance.start}"


def parse_mig_instance(text: str) -> tuple[int, MigInstance]:
    """The GPU index and instance of a "<gpu index>:<profile>@<start>" entry; ValueError if it is not one."""
    index, sep, rest = text.partition(":")
    profile, at, start = rest.rpartition("@")
    if not sep or not at or not profile or not index.isdigit() or not start.isdigit():
        raise ValueError(f"MIG instance {text!r} is not <gpu index>:<profile>@<start>")
    return int(index), MigInstance(profile=profile, start=int(start))
