"""Fuzzing what a file or a person hands hostler: a value, or hostler's own one-line error.

Four edges: the GGUF reader (mutated and truncated headers, and random values for the keys the
geometry reads), the daemon's config loader, and the command line's numbers and times. Each gets
random inputs from a fixed derandomized seed (the same examples on every run, a modest count
and a deadline, a few seconds in all) and must answer with a value or a
:class:`~hostler.errors.HostlerError` whose message is one line — never another exception, never
slowly. The inputs that crashed or hung on main (issue "Bad input and broken storage") are
pinned as explicit examples.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import math
import struct
import tempfile
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any, TypeVar

import gguf
import numpy as np
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from hostler.capacity.budget import HostMemory, compute_budget
from hostler.capacity.estimate import estimate_llama
from hostler.capacity.gguf_header import read_geometry
from hostler.capacity.ledger import LedgerState, limits_of
from hostler.capacity.plan import PlanRequest, plan_llama
from hostler.capacity.units import GIB
from hostler.cli import build_parser
from hostler.cli.numbers import count, seconds
from hostler.cli.timeparse import parse_moment
from hostler.config import DaemonConfig, load_config
from hostler.errors import HostlerError, ModelFileError

FUZZ = settings(
    derandomize=True,  # a fixed seed: the same examples on every run
    database=None,
    max_examples=100,
    deadline=timedelta(seconds=2),
    suppress_health_check=[HealthCheck.too_slow],
)
T = gguf.GGUFValueType
BUDGET = compute_budget(HostMemory(system_ram=32 * GIB))
R = TypeVar("R")


@pytest.fixture(scope="module")
def scratch() -> Iterator[Path]:
    """One folder for every example's file (hypothesis reruns a test, not its fixtures)."""
    with tempfile.TemporaryDirectory(prefix="hostler-fuzz-") as folder:
        yield Path(folder)


def attempt(call: Callable[[], R], *errors: type[BaseException]) -> R | BaseException:
    """What ``call`` returns, or which of ``errors`` it raised (any other escapes)."""
    try:
        return call()
    except errors as exc:
        return exc


def _one_line(error: HostlerError, prefix: str = "") -> None:
    message = str(error)
    assert message, type(error)
    assert "\n" not in message and "\r" not in message, message
    assert message.startswith(prefix), message


# -- the GGUF reader -------------------------------------------------------------------------

#: The valid header every GGUF example starts from: every kind of value the reader meets.
BASE: dict[str, tuple[Any, ...]] = {
    "llama.block_count": (4, T.UINT32),
    "llama.context_length": (4096, T.UINT32),
    "llama.embedding_length": (64, T.UINT32),
    "llama.attention.head_count": (4, T.UINT32),
    "llama.attention.head_count_kv": ([2, 2, 1, 2], T.ARRAY, T.UINT32),
    "llama.attention.key_length": (16, T.UINT32),
    "llama.attention.value_length": (16, T.UINT32),
    "llama.attention.sliding_window": (128, T.UINT32),
    "llama.attention.sliding_window_pattern": ([True, True, True, False], T.ARRAY, T.BOOL),
    "llama.rope.freq_base": (10000.0, T.FLOAT32),
    "general.alignment": (32, T.UINT32),
    "tokenizer.ggml.tokens": ([f"t{i}" for i in range(12)], T.ARRAY, T.STRING),
    "tokenizer.ggml.merges": (["t 1", "t 2"], T.ARRAY, T.STRING),
}


def write_model(path: Path, keys: dict[str, tuple[Any, ...] | None]) -> Path:
    """A real GGUF (``gguf``'s writer) with the BASE keys, changed by ``keys`` (None removes)."""
    writer = gguf.GGUFWriter(str(path), "llama")
    for key, spec in {**BASE, **keys}.items():
        if spec is not None:
            writer.add_key_value(key, *spec)
    writer.add_tensor("token_embd.weight", np.zeros((12, 8), dtype=np.float32))
    writer.add_tensor("blk.0.attn_q.weight", np.zeros((8, 8), dtype=np.float16))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


with tempfile.TemporaryDirectory() as _folder:
    SEED = write_model(Path(_folder) / "seed.gguf", {}).read_bytes()

#: Values that sit on an edge, packed as the 4- and 8-byte words a header is made of.
WORDS = [
    *(struct.pack("<I", v) for v in (0, 1, 4096, 4097, 2**31 - 1, 2**31, 2**32 - 1)),
    *(struct.pack("<f", v) for v in (math.nan, math.inf, -math.inf, 1.5)),
    *(struct.pack("<Q", v) for v in (0, 2**32, 2**62, 2**63, 2**64 - 1)),
    *(struct.pack("<d", v) for v in (math.nan, math.inf, 1e308, -1e308)),
    struct.pack("<i", -1),
    struct.pack("<q", -(2**63)),
]
_POSITION = st.integers(0, len(SEED))
MUTATION = st.one_of(
    st.tuples(st.just("bytes"), _POSITION, st.binary(min_size=1, max_size=4)),
    st.tuples(st.just("word"), _POSITION, st.sampled_from(WORDS)),
    st.tuples(st.just("cut"), _POSITION, st.just(b"")),
)


def mutate(data: bytes, mutations: list[tuple[str, int, bytes]]) -> bytes:
    out = bytearray(data)
    for kind, position, chunk in mutations:
        if kind == "cut":
            del out[position:]
        else:
            out[position : position + len(chunk)] = chunk
    return bytes(out)


def read_or_refuse(path: Path) -> None:
    """A geometry the planner then prices without error, or one line naming the file; fast."""
    started = time.perf_counter()
    try:
        geometry = read_geometry(path)
    except ModelFileError as exc:
        _one_line(exc, f"{path}: ")
        return
    finally:
        assert time.perf_counter() - started < 1
    estimate_llama(geometry, ctx_total=8192, slots=2, kv_type="q8_0")
    plan = plan_llama(
        PlanRequest("m"), geometry, BUDGET, limits_of(LedgerState(), BUDGET), committed_other=0
    )
    assert plan.slots >= 1
    assert plan.context_window >= 1


# Each byte of the seed's 4.4 KB-style header claiming 4294967295 layers or an absurd length.
_LAYERS_AT = SEED.index(b"llama.block_count") + len(b"llama.block_count") + 4


@FUZZ
@given(mutations=st.lists(MUTATION, min_size=1, max_size=6))
@example(mutations=[("word", _LAYERS_AT, struct.pack("<I", 2**32 - 1))])
@example(mutations=[("word", _LAYERS_AT, struct.pack("<I", 0))])
@example(mutations=[("word", 16, struct.pack("<Q", 2**64 - 1))])  # kv_count
@example(mutations=[("word", 8, struct.pack("<Q", 2**62))])  # tensor_count
@example(mutations=[("cut", len(SEED) // 2, b"")])
def test_a_mutated_header_is_read_or_refused_in_one_line(
    scratch: Path, mutations: list[tuple[str, int, bytes]]
) -> None:
    path = scratch / "mutated.gguf"
    path.write_bytes(mutate(SEED, mutations))
    read_or_refuse(path)


_INTS = {
    T.UINT8: (0, 2**8 - 1),
    T.INT8: (-(2**7), 2**7 - 1),
    T.UINT16: (0, 2**16 - 1),
    T.INT16: (-(2**15), 2**15 - 1),
    T.UINT32: (0, 2**32 - 1),
    T.INT32: (-(2**31), 2**31 - 1),
    T.UINT64: (0, 2**64 - 1),
    T.INT64: (-(2**63), 2**63 - 1),
}
_INTEGER = st.sampled_from(sorted(_INTS)).flatmap(
    lambda kind: st.tuples(
        st.one_of(st.integers(*_INTS[kind]), st.sampled_from(_INTS[kind])), st.just(kind)
    )
)
_FLOAT = st.one_of(
    st.tuples(st.floats(width=32), st.just(T.FLOAT32)),
    st.tuples(st.floats(), st.just(T.FLOAT64)),
)
_SCALAR = st.one_of(
    _INTEGER,
    _FLOAT,
    st.tuples(st.booleans(), st.just(T.BOOL)),
    st.tuples(st.text(max_size=8), st.just(T.STRING)),
)
_ARRAY = st.one_of(
    st.tuples(st.lists(st.integers(0, 2**32 - 1), min_size=1, max_size=8), st.just(T.UINT32)),
    st.tuples(st.lists(st.integers(-(2**31), 2**31 - 1), min_size=1, max_size=8), st.just(T.INT32)),
    st.tuples(st.lists(st.floats(width=32), min_size=1, max_size=8), st.just(T.FLOAT32)),
    st.tuples(st.lists(st.booleans(), min_size=1, max_size=8), st.just(T.BOOL)),
    st.tuples(st.lists(st.text(max_size=4), min_size=1, max_size=8), st.just(T.STRING)),
).map(lambda pair: (pair[0], T.ARRAY, pair[1]))
VALUE = st.one_of(_SCALAR, _ARRAY, st.none())
#: Every key the geometry reads, and one it does not.
KEYS = [
    *(k for k in BASE if k.startswith("llama.attention") or k.count(".") == 1),
    "llama.attention.shared_kv_layers",
    "llama.attention.key_length_swa",
    "llama.full_attention_interval",
    "llama.ssm.inner_size",
    "llama.ssm.conv_kernel",
    "llama.ssm.state_size",
    "llama.expert_count",
    "llama.vocab_size",
    "general.architecture",
    "general.alignment",
    "tokenizer.ggml.tokens",
    "tokenizer.ggml.merges",
]


@FUZZ
@given(keys=st.dictionaries(st.sampled_from(KEYS), VALUE, max_size=4))
@example(keys={"llama.attention.head_count": (math.nan, T.FLOAT32)})
@example(keys={"llama.embedding_length": (math.inf, T.FLOAT64)})
@example(keys={"llama.attention.head_count_kv": (["8", "8"], T.ARRAY, T.STRING)})
@example(
    keys={
        "llama.block_count": (4294967295, T.UINT32),
        "llama.attention.sliding_window_pattern": (4, T.UINT32),
    }
)
@example(keys={"llama.embedding_length": (1e308, T.FLOAT64)})
@example(keys={"llama.attention.key_length": (2**64 - 1, T.UINT64)})
@example(keys={"llama.attention.head_count_kv": (-8, T.INT32)})
@example(keys={"llama.attention.head_count": (0, T.UINT32)})
@example(keys={"llama.block_count": (0, T.UINT32)})
@example(keys={"general.alignment": (0, T.UINT32)})
@example(keys={"llama.block_count": (4096, T.UINT32), "llama.attention.head_count_kv": None})
def test_any_value_for_a_known_key_is_read_or_refused_in_one_line(
    scratch: Path, keys: dict[str, tuple[Any, ...] | None]
) -> None:
    read_or_refuse(write_model(scratch / "values.gguf", keys))


# -- the config loader -----------------------------------------------------------------------


def _toml_float(value: float) -> str:
    if math.isnan(value):
        return "nan"
    if math.isinf(value):
        return "inf" if value > 0 else "-inf"
    return repr(value)


_TOML_KEYS = [
    "key",
    "model",
    "ctx",
    "slots",
    "kv_type",
    "autostart",
    "extra_args",
    "threads",
    "data_dir",
    "idle_timeout",
    "health_interval",
    "ledger",
    "ledger_shared",
    "colour",
]
_TOML_SCALAR = st.one_of(
    st.integers(-(2**70), 2**70).map(str),
    st.floats().map(_toml_float),
    st.booleans().map(lambda b: "true" if b else "false"),
    st.text(max_size=12).map(json.dumps),
    st.sampled_from(
        [
            '"llamacpp:m:0"',
            '"llamacpp:m:²"',
            '"m.gguf"',
            '"m\\u0000.gguf"',
            '"~"',
            '""',
            '"f16"',
            '"q4_0"',
            "1.5e400",
            "-0",
            "0x10",
            "1_000",
            "2026-11-29T14:02:00Z",
            "[]",
            "{}",
        ]
    ),
)
_TOML_VALUE = st.recursive(
    _TOML_SCALAR,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3).map(lambda items: "[" + ", ".join(items) + "]"),
        st.dictionaries(st.sampled_from(_TOML_KEYS), inner, max_size=3).map(
            lambda table: "{" + ", ".join(f"{k} = {v}" for k, v in table.items()) + "}"
        ),
    ),
    max_leaves=6,
)
_TABLE = st.dictionaries(st.sampled_from(_TOML_KEYS), _TOML_VALUE, max_size=6)


def _document(daemon: dict[str, str] | None, engines: list[dict[str, str]]) -> str:
    lines = []
    if daemon is not None:
        lines += ["[daemon]", *(f"{k} = {v}" for k, v in daemon.items())]
    for engine in engines:
        lines += ["[[engines]]", *(f"{k} = {v}" for k, v in engine.items())]
    return "\n".join(lines) + "\n"


CONFIG = st.one_of(
    st.builds(_document, st.none() | _TABLE, st.lists(_TABLE, max_size=3)),
    st.builds(
        _document,
        st.none(),
        st.lists(
            _TABLE.map(lambda t: {"key": '"llamacpp:m:0"', "model": '"m.gguf"', **t}),
            min_size=1,
            max_size=2,
        ),
    ),
    st.text(max_size=80),
)


@FUZZ
@given(text=CONFIG)
@example(text='[[engines]]\nkey = "llamacpp:m:0"\nmodel = "m.gguf"\nctx = 1.5e400\n')
@example(text='[[engines]]\nkey = "llamacpp:m:0"\nmodel = "m.gguf"\nslots = 1025\n')
@example(text='[[engines]]\nkey = "llamacpp:m:0"\nmodel = "m\\u0000.gguf"\n')
@example(text='[daemon]\ndata_dir = "a\\u0000"\n')
@example(text='[[engines]]\nkey = "llamacpp:m:²"\nmodel = "m.gguf"\n')
@example(text="a = " + "[" * 2000 + "]" * 2000 + "\n")
@example(text='[[engines]]\nkey = "llamacpp:m:0"\nmodel = "m.gguf"\nextra_args = {t = nan}\n')
def test_any_config_is_loaded_or_refused_in_one_line(scratch: Path, text: str) -> None:
    path = scratch / "hostler.toml"
    path.write_text(text, encoding="utf-8", errors="surrogatepass")
    try:
        config = load_config(path)
    except HostlerError as exc:
        _one_line(exc, f"{path}: ")
        return
    assert isinstance(config, DaemonConfig)
    assert all(1 <= engine.slots <= 1024 for engine in config.engines)


# -- numbers and times on the command line ----------------------------------------------------

NUMBER_TEXT = st.one_of(
    st.text(max_size=30),
    st.integers(-(2**80), 2**80).map(str),
    st.floats().map(repr),
    st.from_regex(r"\A[-+ ]?[0-9_]{1,40}(\.[0-9]*)?([eE][-+]?[0-9]{1,4})?\Z"),
)


@FUZZ
@given(text=NUMBER_TEXT)
@example(text=str(2**70))
@example(text="0")
@example(text="-3")
@example(text="ten")
@example(text="9" * 5000)
@example(text="1_000")
@example(text="٣")
def test_a_count_is_a_whole_number_in_range_or_a_one_line_refusal(text: str) -> None:
    value = attempt(lambda: count(1, 1024)(text), argparse.ArgumentTypeError)
    if isinstance(value, BaseException):
        assert "\n" not in str(value)
    else:
        assert 1 <= value <= 1024


@FUZZ
@given(text=NUMBER_TEXT)
@example(text="nan")
@example(text="-1")
@example(text="inf")
@example(text="1e999")
@example(text="-0.0")
def test_seconds_are_finite_and_in_range_or_a_one_line_refusal(text: str) -> None:
    value = attempt(lambda: seconds(0.1, 3600)(text), argparse.ArgumentTypeError)
    if isinstance(value, BaseException):
        assert "\n" not in str(value)
    else:
        assert math.isfinite(value) and 0.1 <= value <= 3600


@FUZZ
@given(option=st.sampled_from(["--tail", "--limit", "--after-seq", "--interval"]), text=NUMBER_TEXT)
@example(option="--tail", text=str(2**70))
@example(option="--after-seq", text=str(2**70))
@example(option="--interval", text="nan")
@example(option="--limit", text="-3")
def test_the_events_command_takes_a_number_or_exits_2_in_one_line(option: str, text: str) -> None:
    stderr = io.StringIO()
    argv = ["events", "-f", option, text] if option == "--interval" else ["events", option, text]
    with contextlib.redirect_stderr(stderr):
        args = attempt(lambda: build_parser().parse_args(argv), SystemExit)
    if isinstance(args, BaseException):
        assert isinstance(args, SystemExit) and args.code == 2
        lines = stderr.getvalue().splitlines()
        assert len(lines) == 1, stderr.getvalue()
        assert lines[0].startswith("hostler: error [usage.invalid]: "), lines[0]
    else:
        value = getattr(args, option.lstrip("-").replace("-", "_"))
        assert isinstance(value, int | float) and math.isfinite(value)


_OFFSETS = st.integers(-(23 * 60 + 59), 23 * 60 + 59).map(
    lambda minutes: timezone(timedelta(minutes=minutes))
)
MOMENT_TEXT = st.one_of(
    st.text(max_size=40),
    st.builds(
        lambda sign, amount, fraction, unit, ago: f"{sign}{amount}{fraction}{unit}{ago}",
        st.sampled_from(["", "-"]),
        st.one_of(st.integers(0, 10**6), st.integers(0, 10**30)),
        st.sampled_from(["", ".5", ".000001"]),
        st.sampled_from(list("smhd")),
        st.sampled_from(["", " ago", "  ago"]),
    ),
    st.datetimes(timezones=st.none() | _OFFSETS).map(datetime.isoformat),
)
NOW = st.datetimes(timezones=st.just(UTC))


@FUZZ
@given(text=MOMENT_TEXT, now=NOW)
@example(text="1000000000d", now=datetime(2026, 11, 29, tzinfo=UTC))
@example(text="99999999999999999999d", now=datetime(2026, 11, 29, tzinfo=UTC))
@example(text="9999-12-31T23:59:59-05:00", now=datetime(2026, 11, 29, tzinfo=UTC))
@example(text="0001-01-01T00:00:00+05:00", now=datetime(2026, 11, 29, tzinfo=UTC))
@example(text="1s", now=datetime(1, 1, 1, tzinfo=UTC))
def test_a_time_is_an_aware_utc_moment_or_a_one_line_refusal(text: str, now: datetime) -> None:
    moment = attempt(lambda: parse_moment(text, now=now), HostlerError)
    if isinstance(moment, BaseException):
        assert isinstance(moment, HostlerError) and moment.exit_status == 2
        _one_line(moment, "time ")
    else:
        assert moment.utcoffset() == timedelta(0)
