"""SG6: a process's command line matches its launched argv, behind a ``#!`` interpreter."""

from __future__ import annotations

from hostler.engines.process import SHEBANG_WORDS, argv_fingerprint, cmdline_matches

ARGV = ["/opt/bin/sd-server", "--model", "m.gguf", "--listen-port", "8080"]
PRINT = argv_fingerprint(ARGV)


def test_the_argv_itself_and_behind_one_or_two_interpreter_words() -> None:
    assert SHEBANG_WORDS == 2
    assert cmdline_matches(ARGV, PRINT)
    assert cmdline_matches(["/usr/bin/python3", *ARGV], PRINT)
    assert cmdline_matches(["/usr/bin/env", "python3", *ARGV], PRINT)


def test_three_words_in_front_or_another_argv_do_not_match() -> None:
    assert not cmdline_matches(["/usr/bin/env", "-S", "python3", *ARGV], PRINT)
    assert not cmdline_matches([*ARGV, "--extra"], PRINT)
    assert not cmdline_matches(ARGV[1:], PRINT)  # the program itself is part of the argv
    assert not cmdline_matches([], PRINT)
    assert not cmdline_matches(["python3"], argv_fingerprint([]))  # never down to nothing
