"""nccl-log reads the interface lists NCCL prints (issue #41): container/virtual interfaces
beside a real NIC, and hosts whose bootstrap interface name or address range differs."""

from __future__ import annotations

import pytest

from mldebug.findings import Severity
from mldebug.nccllog.analyze import analyze
from mldebug.nccllog.parse import parse_lines


def _report(lines: list[str]):
    return analyze([parse_lines([ln + "\n" for ln in lines], "if.log")])


def _by(report, code: str):
    return [f for f in report.findings if f.code == code]


def _host(h: str, pid: int, boot: str, net: str, version: str = "2.18.6+cuda12.2") -> list[str]:
    return [f"{h}:{pid}:{pid} [0] NCCL INFO {boot}",
            f"{h}:{pid}:{pid} [0] NCCL INFO NCCL version {version}",
            f"{h}:{pid}:{pid} [0] NCCL INFO {net}"]


@pytest.mark.parametrize("boot,net,virtual,nic,exclude", [
    # 2.18: one bootstrap interface, the NET/Socket list with docker and veth beside eth0
    ("Bootstrap : Using eth0:10.1.2.3<0>",
     "NET/Socket : Using [0]eth0:10.1.2.3<0> [1]docker0:172.17.0.1<0> "
     "[2]veth1234abcd:fe80::1c2f:abff:fe00:1%veth1234abcd<0>", ["docker0", "veth1234abcd"],
     "eth0", "^lo,docker,veth"),
    # 2.2x: 'Bootstrap: Using' without the blank; Kubernetes CNI and flannel interfaces
    ("Bootstrap: Using ens5:10.0.1.5<0>",
     "NET/Socket : Using [0]ens5:10.0.1.5<0> [1]cni0:10.244.0.1<0> [2]flannel.1:10.244.0.0<0>",
     ["cni0", "flannel.1"], "ens5", "^lo,docker,cni"),
    # 2.7: the bootstrap list itself holds the virtual ones; a VPN tunnel and a tap device
    ("Bootstrap : Using [0]enp70s0:192.168.1.20<0> [1]tun0:10.8.0.2<0> [2]tap0:10.9.0.1<0>",
     "NET/Socket : Using [0]enp70s0:192.168.1.20<0>", ["tun0", "tap0"], "enp70s0", "^lo,docker,tun"),
    ("Bootstrap : Using [0]bond0:10.3.0.7<0> [1]br-7f3a9c2d1e4b:172.18.0.1<0> [2]virbr0:192.168.122.1<0>",
     "NET/IB : Using [0]mlx5_0:1/IB ; OOB bond0:10.3.0.7<0>", ["br-7f3a9c2d1e4b", "virbr0"],
     "bond0", "^lo,docker,br-"),
])
def test_virtual_interfaces_beside_a_real_nic(boot, net, virtual, nic, exclude) -> None:
    lines = _host("node1", 100, boot, net) + _host("node2", 200, boot, net)
    found = _by(_report(lines), "nccl-log-iface-virtual")
    titles = " ".join(f.title for f in found)
    for name in virtual:
        assert name in titles, (name, titles)
    for f in found:
        assert f.severity is Severity.WARNING
        assert f"beside {nic}" in f.detail
        assert f.fix.startswith(f"export NCCL_SOCKET_IFNAME={nic} ")
        assert "a leading ^ excludes every prefix listed" in f.fix
        assert set(f.hosts) == {"node1", "node2"}
    assert any(exclude in f.fix for f in found), [f.fix for f in found]


def test_loopback_is_a_hint_on_one_host_and_a_warning_across_hosts() -> None:
    lo = ("Bootstrap : Using lo:127.0.0.1<0>", "NET/Socket : Using [0]lo:127.0.0.1<0>")
    [one] = _by(_report(_host("vm", 1, *lo) + _host("vm", 2, *lo)), "nccl-log-iface-virtual")
    assert one.severity is Severity.HINT and "one host" in one.detail
    [two] = _by(_report(_host("n1", 1, *lo) + _host("n2", 2, *lo)), "nccl-log-iface-virtual")
    assert two.severity is Severity.WARNING and "other nodes cannot reach it" in two.detail


def test_old_one_line_per_interface_shape() -> None:
    lines = ["gpu1:5:5 [0] INFO NET : Using interface eth1:10.0.0.5<0>",
             "gpu1:5:5 [0] INFO NET : Using interface docker0:172.17.0.1<0>",
             "gpu2:6:6 [0] INFO NET : Using interface eth1:10.0.0.6<0>",
             "gpu2:6:6 [0] INFO NET : Using interface docker0:172.17.0.1<0>"]
    [f] = _by(_report(lines), "nccl-log-iface-virtual")
    assert "docker0" in f.title and "export NCCL_SOCKET_IFNAME=eth1 " in f.fix


IB = "NET/IB : Using [0]mlx5_0:1/IB [1]mlx5_1:1/IB [RO]; OOB {oob}"


def test_hosts_bootstrapping_over_different_interface_names() -> None:
    lines = []
    for i, name in enumerate(["eth0", "eth0", "eth0", "ens5"], start=1):
        lines += _host(f"node{i}", i, f"Bootstrap : Using {name}:10.0.0.{i}<0>",
                       IB.format(oob=f"{name}:10.0.0.{i}<0>"))
    report = _report(lines)
    [f] = _by(report, "nccl-log-bootstrap-iface-differs")
    assert f.hosts == ("node4",) and "bootstrap ens5" in f.detail and "node[1-3]" in f.detail
    assert "NCCL_SOCKET_IFNAME=ens5,eth0" in f.fix
    assert not _by(report, "nccl-log-bootstrap-subnet-differs")  # all in 10.0.0.0/8


def test_hosts_bootstrapping_from_different_address_ranges() -> None:
    lines = []
    for i, addr in enumerate(["10.20.0.11", "10.21.3.12", "192.168.1.13"], start=1):
        lines += _host(f"node{i}", i, f"Bootstrap : Using [0]eth0:{addr}<0>",
                       IB.format(oob=f"eth0:{addr}<0>"))
    report = _report(lines)
    [f] = _by(report, "nccl-log-bootstrap-subnet-differs")
    assert f.hosts == ("node3",)
    assert "192.168.0.0/16" in f.detail and "10.0.0.0/8" in f.detail
    assert "NCCL_SOCKET_IFNAME" in f.fix
    assert not _by(report, "nccl-log-bootstrap-iface-differs")


def test_uniform_bootstrap_and_virtual_hosts_are_not_a_difference() -> None:
    lines = []
    for i in range(1, 5):
        lines += _host(f"node{i}", i, f"Bootstrap : Using eth0:10.{i}.0.1<0>",
                       IB.format(oob=f"eth0:10.{i}.0.1<0>"))
    # a host on docker0 is the virtual-interface finding, not a second one about ranges
    lines += _host("node5", 5, "Bootstrap : Using docker0:172.17.0.1<0>",
                   IB.format(oob="docker0:172.17.0.1<0>"))
    report = _report(lines)
    codes = {f.code for f in report.findings}
    assert "nccl-log-iface-virtual" in codes
    assert not codes & {"nccl-log-bootstrap-iface-differs", "nccl-log-bootstrap-subnet-differs"}


@pytest.mark.parametrize("boot", [
    "Bootstrap : Using ", "Bootstrap : Using [0]", "Bootstrap : Using eth0",
    "Bootstrap : Using eth0:<0>", "Bootstrap : Using eth0:999.1.2.3.4<0>",
    "Bootstrap : Using eth0:::::::::::<0>", "Bootstrap : Using " + "[0]x:1.2.3.4<0> " * 5000,
])
def test_odd_interface_lists_never_raise(boot: str) -> None:
    _report(_host("a", 1, boot, "NET/Socket : Using " + boot[18:])
            + _host("b", 2, "Bootstrap : Using eth0:10.0.0.2<0>", "NET/Socket : Using [0]eth0:10.0.0.2<0>"))
