"""The connector plugin's settings from ``kv_connector_extra_config`` (no vLLM needed)."""

from __future__ import annotations

import pytest

import kvdrain
from kvdrain.vllm import Settings, settings_from_extra_config


def test_defaults_follow_vllm_knobs() -> None:
    assert settings_from_extra_config(None) == Settings(
        deadline_ms=480_000, quarantine_ms=60_000, settle_ms=5_000, capacity=4096
    )


def test_derived_from_vllm_lease_and_registration_timeout() -> None:
    s = settings_from_extra_config({"kv_lease_duration": 45, "push_registration_timeout": 120})
    assert s.deadline_ms == 120_000
    assert s.quarantine_ms == 90_000


def test_decoder_ttl_is_the_registration_timeout_default() -> None:
    assert settings_from_extra_config({"decoder_kv_blocks_ttl": 60}).deadline_ms == 60_000


def test_explicit_settings_win() -> None:
    s = settings_from_extra_config(
        {"kvdrain_deadline_ms": 7, "kvdrain_quarantine_ms": 40_000, "kvdrain_settle_ms": 0,
         "kvdrain_capacity": "16"}
    )
    assert s == Settings(deadline_ms=7, quarantine_ms=40_000, settle_ms=0, capacity=16)


def test_nixl_sync_defaults_to_a_synchronized_agent() -> None:
    assert settings_from_extra_config(None).nixl_sync == "strict"
    assert settings_from_extra_config({"kvdrain_nixl_sync": "RW"}).nixl_sync == "rw"
    assert settings_from_extra_config({"kvdrain_nixl_sync": "none"}).nixl_sync == "none"


def test_nixl_stall_bound_defaults_to_five_seconds_and_zero_turns_it_off() -> None:
    assert settings_from_extra_config(None).nixl_stall_ms == 5_000
    assert settings_from_extra_config({"kvdrain_nixl_stall_ms": 250}).nixl_stall_ms == 250
    assert settings_from_extra_config({"kvdrain_nixl_stall_ms": 0}).nixl_stall_ms == 0


def test_nixl_stack_tools_are_an_ordered_subset_of_py_spy_and_gdb() -> None:
    assert settings_from_extra_config(None).nixl_stack_tools == ("py-spy", "gdb")
    extra = {"kvdrain_nixl_stack_tools": "gdb, py-spy"}
    assert settings_from_extra_config(extra).nixl_stack_tools == ("gdb", "py-spy")
    assert settings_from_extra_config({"kvdrain_nixl_stack_tools": ""}).nixl_stack_tools == ()
    as_list: dict[str, object] = {"kvdrain_nixl_stack_tools": ["gdb"]}
    assert settings_from_extra_config(as_list).nixl_stack_tools == ("gdb",)


@pytest.mark.parametrize(
    "extra",
    [
        {"kvdrain_nixl_sync": "off"},
        {"kvdrain_nixl_sync": ""},
        {"kvdrain_nixl_sync": None},
        {"kvdrain_nixl_sync": 1},
        {"kvdrain_quarantine_ms": 30_000},  # not above the 30 s lease
        {"kvdrain_settle_ms": -1},
        {"kvdrain_settle_ms": "soon"},
        {"kvdrain_capacity": 0},
        {"kvdrain_deadline_ms": True},
        {"kvdrain_nixl_stall_ms": -5},
        {"kvdrain_nixl_stack_tools": "lldb"},
        {"kvdrain_nixl_stack_tools": 3},
    ],
)
def test_bad_settings_raise_config_error(extra: dict[str, object]) -> None:
    with pytest.raises(kvdrain.ConfigError):
        settings_from_extra_config(extra)


def test_the_registration_lifetime_is_the_deadline_cut_to_the_quarantine() -> None:
    assert settings_from_extra_config(None).lifetime_ms == 59_000  # 60 s - 1 s margin
    s = settings_from_extra_config(
        {"kv_lease_duration": 1, "kvdrain_deadline_ms": 500, "kvdrain_quarantine_ms": 1_500,
         "kvdrain_margin_ms": 500}
    )
    assert (s.lifetime_ms, s.lease_ms, s.margin_ms) == (500, 1_000, 500)
    s = settings_from_extra_config({"kvdrain_registration_lifetime_ms": 20_000})
    assert s.lifetime_ms == 20_000


@pytest.mark.parametrize(
    ("extra", "names"),
    [
        # The heartbeat case: lease 3 s, quarantine 3 001 ms. A producer may post until
        # its lease ends, up to a lease after the decision: 1 ms left for the WRITE.
        ({"kv_lease_duration": 3, "kvdrain_deadline_ms": 1_000, "kvdrain_quarantine_ms": 3_001},
         "kv_lease_duration"),
        # The quarantine at the lease plus the margin, less 1 ms.
        ({"kv_lease_duration": 30, "kvdrain_quarantine_ms": 30_999}, "kvdrain_margin_ms"),
        # A lifetime the quarantine does not cover with the margin.
        ({"kvdrain_registration_lifetime_ms": 59_001}, "kvdrain_registration_lifetime_ms"),
        ({"kvdrain_registration_lifetime_ms": 0}, "kvdrain_registration_lifetime_ms"),
        # A margin that leaves no lifetime.
        ({"kv_lease_duration": 0, "kvdrain_quarantine_ms": 5_000, "kvdrain_margin_ms": 5_000},
         "kvdrain_margin_ms"),
        ({"kvdrain_margin_ms": "later"}, "kvdrain_margin_ms"),
    ],
)
def test_settings_that_leave_a_window_are_refused(extra: dict[str, object], names: str) -> None:
    with pytest.raises(kvdrain.ConfigError, match=names):
        settings_from_extra_config(extra)


def test_the_edges_of_the_windows_load() -> None:
    # Exactly lease + margin, and exactly lifetime + margin.
    s = settings_from_extra_config({"kv_lease_duration": 3, "kvdrain_quarantine_ms": 4_000})
    assert s.quarantine_ms == 4_000 and s.lifetime_ms == 3_000
    s = settings_from_extra_config(
        {"kv_lease_duration": 3, "kvdrain_quarantine_ms": 3_001, "kvdrain_margin_ms": 1,
         "kvdrain_registration_lifetime_ms": 3_000}
    )
    assert s.lifetime_ms == 3_000
