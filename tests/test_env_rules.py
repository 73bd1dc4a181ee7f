"""Every env check on synthetic facts: it fires when it should and stays quiet otherwise."""

from __future__ import annotations

import pytest
from envfacts import ib, make

from mldebug.env import rules
from mldebug.findings import Severity


def codes(facts, rule=rules.check):
    return {f.code: f for f in rule(facts)}


def test_clean_node_has_no_errors_or_warnings():
    found = rules.check(make())
    assert [f for f in found if f.severity in (Severity.ERROR, Severity.WARNING)] == []


# ---------------------------------------------------------------- deprecated names
@pytest.mark.parametrize("old,new", [
    ("NCCL_ASYNC_ERROR_HANDLING", "TORCH_NCCL_ASYNC_ERROR_HANDLING"),
    ("NCCL_BLOCKING_WAIT", "TORCH_NCCL_BLOCKING_WAIT"),
    ("NCCL_DESYNC_DEBUG", "TORCH_NCCL_DESYNC_DEBUG"),
    ("TORCH_NCCL_TRACE_BUFFER_SIZE", "TORCH_FR_BUFFER_SIZE"),
    ("TORCH_NCCL_DEBUG_INFO_TEMP_FILE", "TORCH_FR_DUMP_TEMP_FILE"),
    ("TORCH_NCCL_TRACE_CPP_STACK", "TORCH_FR_CPP_STACK"),
    ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"),
])
def test_deprecated_name_warns_with_new_name(old, new):
    f = codes(make({old: "1"}), rules.check_deprecated)["env-deprecated"]
    assert f.severity is Severity.WARNING
    assert old in f.title and new in f.title
    assert f.fix == f"export {new}=1; unset {old}"


def test_old_and_new_with_different_values_is_a_conflict_error():
    f = codes(make({"TORCH_NCCL_TRACE_BUFFER_SIZE": "100", "TORCH_FR_BUFFER_SIZE": "2000"}),
              rules.check_deprecated)["env-deprecated-conflict"]
    assert f.severity is Severity.ERROR
    assert "TORCH_NCCL_TRACE_BUFFER_SIZE=100" in f.detail and "ignores" in f.detail


def test_alloc_conf_conflict_explains_precedence():
    f = codes(make({"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True",
                    "PYTORCH_ALLOC_CONF": "max_split_size_mb:128"}),
              rules.check_deprecated)["env-deprecated-conflict"]
    assert "reads PYTORCH_CUDA_ALLOC_CONF first" in f.detail


def test_old_and_new_with_same_value_is_a_hint():
    found = codes(make({"NCCL_BLOCKING_WAIT": "1", "TORCH_NCCL_BLOCKING_WAIT": "1"}),
                  rules.check_deprecated)
    assert found["env-deprecated-duplicate"].severity is Severity.HINT
    assert "env-deprecated-conflict" not in found


def test_fr_names_follow_the_torch_version():
    old_torch = {"status": "ok", "version": "2.5.1+cu124"}
    # On torch 2.5 the old name is right and the new one does nothing.
    assert "env-deprecated" not in codes(make({"TORCH_NCCL_TRACE_BUFFER_SIZE": "2000"},
                                              torch=old_torch), rules.check_deprecated)
    f = codes(make({"TORCH_FR_BUFFER_SIZE": "2000"}, torch=old_torch),
              rules.check_deprecated)["env-too-new"]
    assert "export TORCH_NCCL_TRACE_BUFFER_SIZE=2000" in f.fix


# ---------------------------------------------------------------- NCCL_DEBUG family
def test_nccl_debug_invalid_value():
    assert codes(make({"NCCL_DEBUG": "VERBOSE"}))["nccl-debug-invalid"].severity is Severity.ERROR
    assert "nccl-debug-invalid" not in codes(make({"NCCL_DEBUG": "warn"}))


def test_nccl_debug_subsys_unknown_entries_named():
    f = codes(make({"NCCL_DEBUG": "WARN", "NCCL_DEBUG_SUBSYS": "INIT,NETWORK,COLL"}))[
        "nccl-debug-subsys-unknown"]
    assert "NETWORK" in f.title and "COLL" not in f.title
    assert "nccl-debug-subsys-unknown" not in codes(make({"NCCL_DEBUG_SUBSYS": "^INIT,ALLOC_HOST"}))


def test_nccl_debug_file_tilde_and_shared():
    found = codes(make({"NCCL_DEBUG": "INFO", "NCCL_DEBUG_FILE": "~/nccl.log",
                        "WORLD_SIZE": "16"}))
    assert found["nccl-debug-file-tilde"].severity is Severity.ERROR
    shared = found["nccl-debug-file-shared"]
    assert shared.severity is Severity.WARNING and "%h or %p" in shared.title
    single = codes(make({"NCCL_DEBUG": "INFO", "NCCL_DEBUG_FILE": "/tmp/nccl.%h.log"}))
    assert single["nccl-debug-file-shared"].severity is Severity.HINT  # world size unknown
    ok = codes(make({"NCCL_DEBUG": "INFO", "NCCL_DEBUG_FILE": "/tmp/nccl.%h.%p.log",
                     "WORLD_SIZE": "16"}))
    assert "nccl-debug-file-shared" not in ok and "nccl-debug-file-tilde" not in ok


def test_nccl_debug_file_without_level_is_unused():
    assert "nccl-debug-file-unused" in codes(make({"NCCL_DEBUG_FILE": "/tmp/n.%h.%p"}))


# ---------------------------------------------------------------- interfaces
def test_socket_ifname_matching_nothing_names_real_interfaces():
    f = codes(make({"NCCL_SOCKET_IFNAME": "eth9"}))["nccl-socket-ifname-no-match"]
    assert f.severity is Severity.ERROR
    assert "eth0 (ethernet)" in f.detail and "docker0" in f.detail
    assert f.fix.startswith("export NCCL_SOCKET_IFNAME==eth0")


def test_socket_ifname_exact_exclude_and_prefix_forms():
    assert "nccl-socket-ifname-no-match" not in codes(make({"NCCL_SOCKET_IFNAME": "eth"}))
    assert "nccl-socket-ifname-no-match" in codes(make({"NCCL_SOCKET_IFNAME": "=eth"}))
    assert "nccl-socket-ifname-no-match" not in codes(make({"NCCL_SOCKET_IFNAME": "^docker"}))
    down = make({"NCCL_SOCKET_IFNAME": "=eth0"}, interfaces=[
        {"name": "eth0", "kind": "ethernet", "running": False, "addresses": ["10.0.0.1"]},
        {"name": "lo", "kind": "loopback", "addresses": ["127.0.0.1"]}])
    f = codes(down)["nccl-socket-ifname-no-match"]
    assert "eth0 matches but is down" in f.title


def test_socket_ifname_selecting_only_local_interfaces():
    f = codes(make({"NCCL_SOCKET_IFNAME": "=lo,docker0"}))["nccl-socket-ifname-local-only"]
    assert f.severity is Severity.WARNING and "lo, docker0" in f.title


def test_socket_ifname_one_character_is_ignored():
    f = codes(make({"NCCL_SOCKET_IFNAME": "e"}))["nccl-socket-ifname-ignored"]
    assert "ignored" in f.title


def test_ib_hca_against_real_hcas():
    hcas = ib("mlx5_0", "mlx5_1", "mlx5_bond_0")
    bad = codes(make({"NCCL_IB_HCA": "=mlx4_0"}, ib_devices=hcas))["nccl-ib-hca-no-match"]
    assert bad.severity is Severity.ERROR and "mlx5_0:1" in bad.detail
    assert "mlx5_bond_0" not in bad.fix
    assert "nccl-ib-hca-no-match" not in codes(make({"NCCL_IB_HCA": "=mlx5_0:1,mlx5_1:1"},
                                                    ib_devices=hcas))
    port2 = codes(make({"NCCL_IB_HCA": "=mlx5_0:2"}, ib_devices=hcas))
    assert "nccl-ib-hca-no-match" in port2
    assert codes(make({"NCCL_IB_HCA": "mlx5"}, ib_devices=hcas))["nccl-ib-hca-bond"].severity \
        is Severity.WARNING
    assert "nccl-ib-hca-bond" not in codes(make({"NCCL_IB_HCA": "^mlx5_bond_0"}, ib_devices=hcas))
    assert codes(make({}, ib_devices=hcas))["nccl-ib-hca-bond"].severity is Severity.HINT
    assert "nccl-ib-hca-no-devices" in codes(make({"NCCL_IB_HCA": "mlx5"}))
    inactive = codes(make({"NCCL_IB_HCA": "mlx5_0"}, ib_devices=ib("mlx5_0", state="DOWN")))
    assert "nccl-ib-hca-inactive" in inactive


def test_ib_disabled_with_hcas_present():
    assert "nccl-ib-disabled" in codes(make({"NCCL_IB_DISABLE": "1"}, ib_devices=ib("mlx5_0")))
    assert "nccl-ib-disabled" not in codes(make({"NCCL_IB_DISABLE": "1"}))


# ---------------------------------------------------------------- debug settings
@pytest.mark.parametrize("name,value", [
    ("NCCL_DEBUG", "INFO"), ("NCCL_DEBUG", "TRACE"), ("CUDA_LAUNCH_BLOCKING", "1"),
    ("TORCH_NCCL_BLOCKING_WAIT", "1"), ("TORCH_DISTRIBUTED_DEBUG", "DETAIL"),
    ("NCCL_P2P_DISABLE", "1"), ("TORCH_USE_CUDA_DSA", "1"),
])
def test_debug_settings_left_on(name, value):
    found = [f for f in rules.check_debug_settings(make({name: value}))]
    assert len(found) == 1 and found[0].title.startswith(f"{name}={value}")
    assert found[0].fix == f"unset {name} once you are done debugging."


def test_debug_settings_off_are_quiet():
    assert rules.check_debug_settings(make({"NCCL_DEBUG": "WARN", "CUDA_LAUNCH_BLOCKING": "0",
                                            "TORCH_DISTRIBUTED_DEBUG": "OFF"})) == []


# ---------------------------------------------------------------- limits, ptrace, cores
def test_small_shm_and_memlock():
    found = codes(make(limits={"shm_bytes": 64 << 20, "memlock_soft": 65536}))
    assert "64 MiB" in found["shm-small"].title
    assert found["memlock-limited"].severity is Severity.HINT  # no IB here
    with_ib = codes(make(limits={"memlock_soft": 65536}, ib_devices=ib("mlx5_0")))
    assert with_ib["memlock-limited"].severity is Severity.WARNING


@pytest.mark.parametrize("scope,cap,expect", [
    (0, False, False), (1, False, True), (1, True, False), (2, False, True), (2, True, False),
    (3, True, True), (None, False, False),
])
def test_ptrace_scope(scope, cap, expect):
    found = codes(make(ptrace={"yama_ptrace_scope": scope, "cap_sys_ptrace": cap}))
    assert ("ptrace-denied" in found) is expect
    if expect:
        assert "mldebug hang" in found["ptrace-denied"].title


def test_py_spy_missing_or_broken():
    assert "py-spy-missing" in codes(make(py_spy={"path": None}))
    assert "py-spy-broken" in codes(make(py_spy={"path": "/x/py-spy", "runs": False}))


def test_core_dump_settings():
    found = codes(make(limits={"core_soft": 0},
                       core={"pattern": "|/usr/share/apport/apport -p%p -s%s -c%c",
                             "pipe_handler": "apport"}))
    assert "core-disabled" in found and "core-apport" in found
    assert "core-systemd" in codes(make(core={"pattern": "|/lib/systemd/systemd-coredump %P",
                                              "pipe_handler": "systemd-coredump"}))


# ---------------------------------------------------------------- rendezvous and world
def test_master_addr_unresolvable_and_port_closed():
    found = codes(make({"MASTER_ADDR": "nosuch", "MASTER_PORT": "29500"},
                       master_addr={"host": "nosuch", "addresses": [], "error": "Name or service not known"},
                       ports=[{"target": "nosuch:29500", "open": False, "error": "refused"}]))
    assert found["master-addr-unresolvable"].severity is Severity.ERROR
    assert "Name or service not known" in found["master-addr-unresolvable"].detail
    assert found["port-unreachable"].severity is Severity.ERROR
    assert "master-port-invalid" in codes(make({"MASTER_PORT": "http"}))


def test_world_size_inconsistent_with_gpus():
    found = codes(make({"WORLD_SIZE": "16", "LOCAL_WORLD_SIZE": "8", "CUDA_VISIBLE_DEVICES": "0,1,2,3"}))
    f = found["world-more-ranks-than-gpus"]
    assert "LOCAL_WORLD_SIZE=8 but only 4 GPU(s)" in f.title
    assert "world-more-ranks-than-gpus" not in codes(make({"LOCAL_WORLD_SIZE": "8"}))
    assert "world-size-inconsistent" in codes(make({"WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "8"}))
    assert "world-size-uneven" in codes(make({"WORLD_SIZE": "12", "LOCAL_WORLD_SIZE": "8"}))
    assert "world-rank-range" in codes(make({"RANK": "16", "WORLD_SIZE": "16"}))
    assert "world-not-integer" in codes(make({"WORLD_SIZE": "sixteen"}))
    assert "cuda-visible-devices-invalid" in codes(make({"CUDA_VISIBLE_DEVICES": "0,8"}))


# ---------------------------------------------------------------- torch and GPUs
def test_torch_probe_outcomes_become_findings():
    assert codes(make(torch={"status": "timeout", "timeout_s": 10}))[
        "torch-probe-timeout"].severity is Severity.WARNING
    broken = codes(make(torch={"status": "error", "error": "ImportError: libcudart.so.12"}))
    assert broken["torch-broken"].severity is Severity.ERROR
    assert "libcudart" in broken["torch-broken"].detail
    assert codes(make(torch={"status": "missing"}))["torch-missing"].severity is Severity.INFO
    cpu = codes(make(torch={"status": "ok", "version": "2.9.1+cpu", "cuda": None}))
    assert "torch-cpu-build-on-gpu-node" in cpu


def test_p2p_matrix_not_ok():
    p2p = [["X", "CNS"], ["CNS", "X"]]
    f = codes(make(gpus={"devices": [{"name": "NVIDIA L4"}] * 2, "p2p": p2p}))["gpu-p2p-unsupported"]
    assert "GPU0-GPU1: CNS" in f.detail


def test_facts_that_could_not_be_gathered_are_reported():
    f = codes(make(errors={"interfaces": "PermissionError: /sys/class/net"}))["collect-error"]
    assert "interfaces" in f.title and "PermissionError" in f.detail
