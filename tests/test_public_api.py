"""The curated public API: what ``import hostler`` offers is deliberate, and pinned here."""

from __future__ import annotations

import inspect
from pathlib import Path

import hostler
from hostler import errors

from _support import REPO

PUBLIC = {
    "AppendResult",
    "CapacityDeniedError",
    "EngineBinaryError",
    "EngineBusyError",
    "Runtime",
    "RuntimeClosedError",
    "EngineStartError",
    "ModelFileError",
    "RestartBudgetError",
    "UnknownEngineError",
    "ConcurrencyError",
    "Engine",
    "EngineState",
    "Event",
    "EventStore",
    "HostlerError",
    "IllegalTransitionError",
    "Lease",
    "LeaseSlot",
    "LeaseState",
    "LifecycleModel",
    "RecordedEvent",
    "Reservation",
    "ReservationState",
    "StopReason",
    "StoreBusyError",
    "StoreCorruptError",
    "StoreDamagedRowError",
    "StoreError",
    "StoreDriverError",
    "StoreForeignError",
    "StoreFullError",
    "StoreLockedError",
    "StorePathError",
    "StoreSchemaError",
    "StoreUrlError",
    "TransitionEvent",
    "UnknownEvent",
    "UsageError",
    "World",
    "__version__",
    "commit",
    "event_type",
    "load",
    "open_daemon",
    "registered_types",
    "replay",
    "run_daemon",
    "upcaster",
}


def test_public_names_are_pinned() -> None:
    assert set(hostler.__all__) == PUBLIC
    for name in hostler.__all__:
        assert hasattr(hostler, name), name


def test_every_public_name_has_a_docstring() -> None:
    for name in hostler.__all__:
        obj = getattr(hostler, name)
        if inspect.isclass(obj) or inspect.isfunction(obj):
            assert inspect.getdoc(obj), name


def test_errors_form_one_hierarchy_with_unique_documented_codes() -> None:
    classes = [getattr(errors, n) for n in errors.__all__]
    defined = {c for c in vars(errors).values() if inspect.isclass(c) and issubclass(c, Exception)}
    assert defined == set(classes), "every error class is exported"
    assert all(issubclass(c, hostler.HostlerError) for c in classes)
    codes = [c.code for c in classes]
    assert len(codes) == len(set(codes))
    text = (REPO / "docs" / "errors.md").read_text(encoding="utf-8")
    rows = [line for line in text.splitlines() if line.startswith("| `")]
    for cls in classes:
        row = next((r for r in rows if r.startswith(f"| `{cls.__name__}` | `{cls.code}` |")), None)
        assert row is not None, f"{cls.__name__} ({cls.code}) has no row in docs/errors.md"
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert len(cells) == 4 and all(cells), f"{cls.__name__}: cause and fix both said"
    assert len(rows) == len(classes)


def test_the_plugin_contract_is_pinned() -> None:
    import hostler.plugin

    assert set(hostler.plugin.__all__) == {
        "ENGINE_NAME_MAX",
        "ENGINE_NAME_PATTERN",
        "GPU_SLOTS",
        "MAX_IDLE_TIMEOUT",
        "MAX_STARTUP_TIMEOUT",
        "PROJECT",
        "RESERVED_ENGINE_NAMES",
        "CacheAdapter",
        "CacheEntry",
        "EngineAdapter",
        "EngineBinaryError",
        "EngineStartError",
        "ExtraArgs",
        "FatalLines",
        "LaunchCommand",
        "LaunchSpec",
        "ModelFileError",
        "ModelGeometry",
        "ModelKind",
        "Offload",
        "OffloadPlan",
        "OptionType",
        "Panic",
        "Progress",
        "ReadinessProbe",
        "Register",
        "SessionCache",
        "SessionPrepared",
        "SessionSaved",
        "SettingError",
        "UsageError",
        "check_model_path",
        "context_floor",
        "engine_name_problem",
        "entry_bytes",
        "estimate_llama",
        "exact_linearization",
        "extra_args_argv",
        "find_engine_binary",
        "flag_argv",
        "flag_of",
        "flag_key_problem",
        "heuristic_per_slot_kv",
        "hookimpl",
        "host_cpu_flags",
        "hookspec",
        "json_fields_match",
        "launch_command",
        "options_schema_problem",
        "parse_json",
        "parse_whole",
        "read_gguf_metadata",
        "read_small_file",
        "round_half_up",
        "timing_problem",
        "validate_options",
    }
    for name in hostler.plugin.__all__:
        obj = getattr(hostler.plugin, name)
        if inspect.isclass(obj) or inspect.isfunction(obj):
            assert inspect.getdoc(obj), name
    # every hook an adapter may override, with the default that keeps old adapters working
    adapter = hostler.plugin.EngineAdapter
    assert adapter.readiness_path == "/health"
    assert adapter.model_kind == "file"
    assert adapter.applies_extra_args is False
    assert adapter.join_dash_values is False  # RD5: llama.cpp's `--key value` by default
    assert dict(adapter.options_schema) == {}
    assert adapter.kv_headroom is None
    assert adapter.gpu_slot == "llm"
    assert (adapter.startup_timeout, adapter.default_idle_timeout) == (180.0, None)  # RD7
    assert (hostler.plugin.MAX_STARTUP_TIMEOUT, hostler.plugin.MAX_IDLE_TIMEOUT) == (
        86_400.0,
        31_536_000.0,
    )
    assert hostler.plugin.LaunchSpec("k", Path("m"), 1, 1).reserved_bytes is None  # RD8
    from hostler.testing.fake_engine import FakeEngineAdapter  # keeps every default hook

    early = "k: exited (exit code 1) before becoming ready"
    assert FakeEngineAdapter().on_exited_before_ready(early) is False  # RD9: no sweep by default
    assert FakeEngineAdapter().slot_limit(hostler.plugin.ModelGeometry()) is None  # S8: max_slots
    assert hostler.plugin.GPU_SLOTS == ("llm", "image", "video")
    reserved = hostler.plugin.RESERVED_ENGINE_NAMES
    assert reserved == frozenset({"unavailable"})
    assert (hostler.plugin.ENGINE_NAME_PATTERN, hostler.plugin.ENGINE_NAME_MAX) == (
        "[a-z0-9][a-z0-9_-]*",
        40,
    )


def test_device_unhealthy_error_is_pinned() -> None:
    err = errors.DeviceUnhealthyError("image workload", 12.0, ["GPU 0 at 90 °C"], "guard")
    assert errors.DeviceUnhealthyError.code == "device.unhealthy"
    assert errors.DeviceUnhealthyError.exit_status == 1
    assert not isinstance(err, errors.UsageError)
    assert str(err).startswith("image workload blocked after 12.0 s by the device health gate")
    assert "GPU 0 at 90 °C" in str(err) and "HOSTLER_DEVICE_SAFETY_MODE" in str(err)


def test_export_and_import_errors_are_pinned() -> None:
    assert errors.StoreNotEmptyError.code == "store.not-empty"
    assert issubclass(errors.StoreNotEmptyError, errors.StoreError)
    assert errors.OutputError.code == "output.failed"
    assert errors.OutputError.exit_status == 1
    assert not issubclass(errors.OutputError, errors.UsageError)
    assert errors.ExportFormatError.code == "export.format"
    assert errors.ExportFormatError.exit_status == 1
    assert not issubclass(errors.ExportFormatError, errors.UsageError)
