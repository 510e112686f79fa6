"""Outside input read and parsed within bounds (hostler.untrusted, hostler.smallfile).

Real files, real FIFOs, real links to a real device: each hole is shown against the
stdlib call it replaces, then closed.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest

from hostler.plugin import parse_json, parse_whole, read_small_file
from hostler.untrusted import WHOLE_CEILING, WHOLE_DIGITS
from hostler_llamacpp.adapter import BUILD_SIDECAR, build_metadata

DEEP = "[" * 100_000 + "]" * 100_000


def test_the_stdlib_decoder_raises_recursion_error_on_deep_nesting() -> None:
    """The hole itself: json.loads raises RecursionError, which `except ValueError` misses."""
    with pytest.raises(RecursionError):
        json.loads(DEEP)


@pytest.mark.parametrize("data", [DEEP, DEEP.encode(), '{"a":' + DEEP + "}"])
def test_deep_nesting_is_a_value_error(data: str | bytes) -> None:
    with pytest.raises(ValueError, match="nests too deep to read"):
        parse_json(data)


@pytest.mark.parametrize(
    ("data", "says"),
    [(b"", "Expecting value"), (b"{", "Expecting property"), (b"\xff\xfe\x00", "decode"),
     (b"1" * 5000, "4300")],
)  # fmt: skip
def test_every_other_bad_json_is_a_value_error(data: bytes, says: str) -> None:
    with pytest.raises(ValueError, match=says):
        parse_json(data)


def test_json_nested_as_real_configs_are_is_read() -> None:
    shallow = "[" * 50 + "]" * 50
    assert parse_json('{"a": ' + shallow + "}") == {"a": json.loads(shallow)}
    assert parse_json(b'{"choices": [1]}') == {"choices": [1]}


def test_whole_numbers_read_as_int_does() -> None:
    assert parse_whole("0") == 0
    assert parse_whole(" 42 ") == 42
    assert parse_whole("-7") == -7
    assert parse_whole("+7") == 7
    assert parse_whole("000123") == 123


@pytest.mark.parametrize("text", ["", " ", "1.5", "12abc", "1e3", "--1", "²", "١٢", "0x10"])
def test_what_is_no_whole_number_is_none(text: str) -> None:
    assert parse_whole(text) is None


def test_thirty_digits_convert_and_thirty_one_saturate() -> None:
    assert WHOLE_DIGITS == 30
    assert WHOLE_CEILING == 10**30
    assert parse_whole("9" * 30) == 10**30 - 1
    assert parse_whole("1" + "0" * 30) == WHOLE_CEILING  # 31 digits: saturated (equal by value)
    assert parse_whole("9" * 31) == WHOLE_CEILING
    assert parse_whole("-" + "9" * 31) == -WHOLE_CEILING
    assert parse_whole("0" * 100 + "5") == 5  # leading zeros are no digits


def test_five_thousand_digits_saturate_where_int_raises() -> None:
    with pytest.raises(ValueError, match="4300"):
        int("1" * 5000)
    assert parse_whole("1" * 5000) == WHOLE_CEILING


def test_a_small_file_is_read_whole_up_to_its_limit(tmp_path: Path) -> None:
    path = tmp_path / "f.json"
    path.write_bytes(b"x" * 100)
    assert read_small_file(path, 100) == b"x" * 100  # exactly the limit: read
    assert read_small_file(path, 1000) == b"x" * 100
    with pytest.raises(ValueError, match="larger than 99 bytes"):
        read_small_file(path, 99)
    empty = tmp_path / "empty"
    empty.write_bytes(b"")
    assert read_small_file(empty, 0) == b""


def test_a_link_to_a_regular_file_is_followed(tmp_path: Path) -> None:
    (tmp_path / "blob").write_bytes(b"{}")
    (tmp_path / "config.json").symlink_to(tmp_path / "blob")
    assert read_small_file(tmp_path / "config.json", 10) == b"{}"


def test_a_fifo_is_refused_without_waiting_for_a_writer(tmp_path: Path) -> None:
    fifo = tmp_path / "config.json"
    os.mkfifo(fifo)
    outcome: list[BaseException | bytes] = []

    def read() -> None:
        try:
            outcome.append(read_small_file(fifo, 1024))
        except BaseException as exc:
            outcome.append(exc)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(5)
    if reader.is_alive():  # unblock the reader before failing: open a writer
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        pytest.fail("read_small_file waited on a FIFO")
    assert isinstance(outcome[0], ValueError)
    assert str(outcome[0]) == "is a FIFO (named pipe), not a regular file"


def test_a_link_to_dev_zero_is_refused_without_reading_it(tmp_path: Path) -> None:
    """stat() says 0 bytes and read_bytes() never ends: the open descriptor is a device."""
    link = tmp_path / "config.json"
    link.symlink_to("/dev/zero")
    assert link.stat().st_size == 0
    with pytest.raises(ValueError, match=r"^is a character device, not a regular file$"):
        read_small_file(link, 1024)


def test_a_directory_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"^is a directory, not a regular file$"):
        read_small_file(tmp_path, 1024)


def test_an_absent_file_is_file_not_found(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        read_small_file(tmp_path / "absent", 1024)


@pytest.mark.parametrize("kind", ["fifo", "deep", "huge"])
def test_a_llama_build_sidecar_that_is_no_small_json_file_is_no_sidecar(
    tmp_path: Path, kind: str
) -> None:
    """L18's sidecar is read with the same reader: a FIFO there never hangs the adapter."""
    binary = tmp_path / "llama-server"
    binary.write_bytes(b"")
    sidecar = tmp_path / BUILD_SIDECAR
    if kind == "fifo":
        os.mkfifo(sidecar)
    elif kind == "deep":
        sidecar.write_text('{"schemaVersion": 1, "x": ' + DEEP + "}")
    else:
        good = {"schemaVersion": 1, "engine": "llamacpp", "revision": "abc"}
        sidecar.write_text(json.dumps({**good, "pad": "x" * 70_000}))
        assert build_metadata(binary) is None
        sidecar.write_text(json.dumps(good))
        assert build_metadata(binary) == good  # the same sidecar, small: read
        return
    assert build_metadata(binary) is None


def test_an_mlx_config_json_linked_to_dev_zero_is_one_line(tmp_path: Path) -> None:
    from hostler.errors import ModelFileError
    from hostler_mlx.geometry import read_config

    (tmp_path / "config.json").symlink_to("/dev/zero")
    with pytest.raises(ModelFileError) as raised:
        read_config(tmp_path)
    assert str(raised.value) == (
        f"{tmp_path / 'config.json'}: is a character device, not a regular file"
    )
