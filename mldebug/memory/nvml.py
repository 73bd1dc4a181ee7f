"""Which NVML device is this process's CUDA device?

CUDA numbers the devices it can see (CUDA_VISIBLE_DEVICES, in CUDA_DEVICE_ORDER, by default
fastest first), NVML numbers every device of the node in PCI bus order, and
CUDA_VISIBLE_DEVICES may name devices by index, by (a prefix of) their UUID, or by MIG
instance (``MIG-<uuid>`` or the old ``MIG-GPU-<uuid>/<gi>/<ci>``). Parsing the first entry
with ``int()`` - as the common snippet does - breaks on all but the first form and is wrong
without PCI_BUS_ID order. ``resolve`` handles each; it takes the NVML module as an argument
so the logic is tested without a GPU.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def visible_entry(env: Mapping[str, str], cuda_index: int) -> str | None:
    """The CUDA_VISIBLE_DEVICES entry of CUDA device ``cuda_index`` (None: variable unset)."""
    raw = env.get("CUDA_VISIBLE_DEVICES")
    if raw is None:
        return None
    entries = [e.strip() for e in raw.split(",") if e.strip()]
    if cuda_index >= len(entries):
        raise LookupError(f"CUDA device {cuda_index} is not in CUDA_VISIBLE_DEVICES={raw!r}")
    return entries[cuda_index]


def _text(v: Any) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _by_uuid_prefix(nvml: Any, prefix: str) -> Any:
    for i in range(nvml.nvmlDeviceGetCount()):
        h = nvml.nvmlDeviceGetHandleByIndex(i)
        if _text(nvml.nvmlDeviceGetUUID(h)).startswith(prefix):
            return h
    raise LookupError(f"no GPU with a UUID starting {prefix!r}")


def _mig_devices(nvml: Any, parent: Any) -> list[Any]:
    out: list[Any] = []
    try:
        count = nvml.nvmlDeviceGetMaxMigDeviceCount(parent)
    except Exception:  # not MIG-capable
        return out
    for k in range(count):
        try:
            out.append(nvml.nvmlDeviceGetMigDeviceHandleByIndex(parent, k))
        except Exception:  # an empty slot
            continue
    return out


def _mig(nvml: Any, entry: str) -> Any:
    if entry.startswith("MIG-GPU-"):  # MIG-GPU-<uuid>/<gi>/<ci> (drivers before 470)
        uuid, _, rest = entry[len("MIG-"):].partition("/")
        gi, _, ci = rest.partition("/")
        parent = _by_uuid_prefix(nvml, uuid)
        for m in _mig_devices(nvml, parent):
            if (nvml.nvmlDeviceGetGpuInstanceId(m) == int(gi)
                    and nvml.nvmlDeviceGetComputeInstanceId(m) == int(ci or 0)):
                return m
        raise LookupError(f"no MIG instance {gi}/{ci} on {uuid}")
    for i in range(nvml.nvmlDeviceGetCount()):
        for m in _mig_devices(nvml, nvml.nvmlDeviceGetHandleByIndex(i)):
            if _text(nvml.nvmlDeviceGetUUID(m)).startswith(entry):
                return m
    raise LookupError(f"no MIG instance with UUID {entry!r}")


def resolve(nvml: Any, cuda_index: int, env: Mapping[str, str],
            pci_bus_id: str | None = None, uuid: str | None = None) -> tuple[Any, str]:
    """(NVML handle, how it was found) for CUDA device ``cuda_index``.

    ``uuid`` / ``pci_bus_id`` (from torch's device properties, when known) are exact for whole GPUs;
    MIG instances are found by their UUID, since they share the parent's bus id.
    """
    entry = visible_entry(env, cuda_index)
    if entry is not None and entry.startswith("MIG-"):
        return _mig(nvml, entry), f"MIG instance {entry}"
    if uuid:
        full = uuid if uuid.startswith("GPU-") else f"GPU-{uuid}"
        return _by_uuid_prefix(nvml, full), f"UUID {full} (from torch)"
    if pci_bus_id:
        return nvml.nvmlDeviceGetHandleByPciBusId(pci_bus_id), f"PCI bus id {pci_bus_id}"
    if entry is not None and entry.startswith("GPU-"):
        return _by_uuid_prefix(nvml, entry), f"UUID {entry}"
    index = int(entry) if entry is not None else cuda_index
    how = f"NVML index {index}"
    if env.get("CUDA_DEVICE_ORDER") != "PCI_BUS_ID" and nvml.nvmlDeviceGetCount() > 1:
        how += " (assumes CUDA_DEVICE_ORDER=PCI_BUS_ID)"
    return nvml.nvmlDeviceGetHandleByIndex(index), how


def used_bytes(cuda_index: int, env: Mapping[str, str], uuid: str | None = None,
               nvml: Any = None) -> int | None:
    """Memory used on the device as nvidia-smi shows it; None without NVML or a device."""
    if nvml is None:
        try:
            import pynvml  # nvidia-ml-py
        except ImportError:
            return None
        nvml = pynvml
    try:
        nvml.nvmlInit()
        handle, _ = resolve(nvml, cuda_index, env, uuid=uuid)
        return int(nvml.nvmlDeviceGetMemoryInfo(handle).used)
    except Exception:  # NVMLError (no driver), LookupError, ValueError
        return None
