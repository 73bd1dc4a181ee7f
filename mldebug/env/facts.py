"""The facts of one node as plain dataclasses, built from the node script's JSON document.

``node.py`` gathers (it must stay stdlib-only and dataclass-free to run anywhere);
this module gives the analysis typed access to what it gathered. Missing keys read as
"unknown", so documents from older or partial collections still load.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Interface:
    name: str
    kind: str  # ib / ethernet / bond / bridge / docker / loopback / virtual
    up: bool = True
    running: bool = True
    addresses: tuple[str, ...] = ()

    @property
    def usable(self) -> bool:
        """NCCL only considers interfaces that are running (IFF_RUNNING) with an address."""
        return self.running and bool(self.addresses)


@dataclass(frozen=True)
class IbPort:
    device: str
    port: int
    state: str = ""
    link_layer: str = ""


def _obj(d: dict[str, Any], key: str) -> dict[str, Any]:
    value = d.get(key)
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise TypeError(f"{key} is a {type(value).__name__}, not an object")
    return value


def _list(d: dict[str, Any], key: str) -> list[Any]:
    value = d.get(key)
    if value is None:
        return []
    if not isinstance(value, list):
        raise TypeError(f"{key} is a {type(value).__name__}, not a list")
    return value


def _objects(d: dict[str, Any], key: str) -> list[dict[str, Any]]:
    items = _list(d, key)
    for item in items:
        if not isinstance(item, dict):
            raise TypeError(f"{key} holds a {type(item).__name__}, not an object")
    return items


def _port(value: Any) -> int:
    try:
        return int(value)
    except (TypeError, ValueError):
        return 0


@dataclass
class NodeFacts:
    host: str
    env: dict[str, str] = field(default_factory=dict)
    interfaces: list[Interface] = field(default_factory=list)
    ib_ports: list[IbPort] = field(default_factory=list)
    torch: dict[str, Any] = field(default_factory=dict)
    gpus: dict[str, Any] = field(default_factory=dict)
    limits: dict[str, Any] = field(default_factory=dict)
    ptrace: dict[str, Any] = field(default_factory=dict)
    core: dict[str, Any] = field(default_factory=dict)
    py_spy: dict[str, Any] = field(default_factory=dict)
    os: dict[str, Any] = field(default_factory=dict)
    python: dict[str, Any] = field(default_factory=dict)
    master_addr: dict[str, Any] | None = None
    ports: list[dict[str, Any]] = field(default_factory=list)
    raw: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> NodeFacts:
        """Typed facts; ``TypeError``/``KeyError`` for a document of the wrong shape (the
        caller reports that node as failed, the others still count)."""
        if not isinstance(d, dict):
            raise TypeError(f"the document is a {type(d).__name__}, not an object")
        ifaces = [
            Interface(str(i["name"]), str(i.get("kind", "ethernet")), bool(i.get("up", True)),
                      bool(i.get("running", True)), tuple(map(str, _list(i, "addresses"))))
            for i in _objects(d, "interfaces")
        ]
        ports = [
            IbPort(str(dev["name"]), _port(p.get("port")), str(p.get("state", "")),
                   str(p.get("link_layer", "")))
            for dev in _objects(d, "ib_devices") for p in _objects(dev, "ports")
        ]
        master = d.get("master_addr")
        return cls(
            host=str(d.get("host", "?")),
            env={str(k): str(v) for k, v in _obj(d, "env").items()},
            interfaces=ifaces,
            ib_ports=ports,
            torch=_obj(d, "torch"),
            gpus=_obj(d, "gpus"),
            limits=_obj(d, "limits"),
            ptrace=_obj(d, "ptrace"),
            core=_obj(d, "core"),
            py_spy=_obj(d, "py_spy"),
            os=_obj(d, "os"),
            python=_obj(d, "python"),
            master_addr=_obj(d, "master_addr") if master is not None else None,
            ports=_objects(d, "ports"),
            raw=d,
        )

    # -- conveniences for the rules ------------------------------------------------
    @property
    def ib_devices(self) -> list[str]:
        return sorted({p.device for p in self.ib_ports})

    @property
    def gpu_count(self) -> int | None:
        """GPUs this node has (NVML, else torch's count when the import probe ran)."""
        devices = self.gpus.get("devices") or []
        if devices:
            return len(devices)
        if self.torch.get("cuda_available") is not None:
            return int(self.torch.get("device_count") or 0)
        if self.gpus.get("source") == "nvml" and "driver" in self.gpus:
            return 0
        return None

    def interface(self, name: str) -> Interface | None:
        return next((i for i in self.interfaces if i.name == name), None)
