"""What follows a failed start (sans I/O): the OOM ladder (L13) and one sweep per ensure (RD9)."""

from __future__ import annotations

from hostler.capacity.offload import Offload, OffloadPlan
from hostler.machines.start import (
    FALLBACK_KV,
    SIGILL,
    AskSweep,
    AttemptBegan,
    EnsureBegan,
    GiveUp,
    Launched,
    RecordCpuLimit,
    RecordDegrade,
    Recorded,
    Retry,
    StartEnded,
    StartFailed,
    StartTries,
    Sweep,
    SweepAnswered,
    Swept,
)

WHOLE = OffloadPlan(Offload.FULL_GPU, None, "fits whole")
ARGV = ("/opt/llama-server", "--model", "/models/m.gguf")
OOM = "cuda-out-of-memory"


def tries(*, pinned: bool = False, offload: OffloadPlan | None = None) -> StartTries:
    made = StartTries(offload=offload, pinned=pinned)
    assert made.handle(EnsureBegan(can_sweep=True)) == []
    return made


def fail(
    t: StartTries,
    *,
    launched: OffloadPlan | None,
    panic: str | None,
    timed_out: bool = False,
    start_error: bool = True,
) -> list[object]:
    assert t.handle(AttemptBegan()) == []
    assert t.handle(Launched(launched, ARGV)) == []
    assert t.handle(StartEnded(panic, timed_out=timed_out)) == []
    return list(t.handle(StartFailed(start_error, "m: exited (exit code 1) before becoming ready")))


def test_out_of_gpu_memory_steps_down_the_ladder_once_recorded() -> None:
    t = tries()
    (degrade,) = fail(t, launched=WHOLE, panic=OOM)
    assert isinstance(degrade, RecordDegrade)
    assert (degrade.panic, degrade.launched, degrade.plan.kind) == (
        OOM,
        WHOLE,
        Offload.ALL_EXPERTS_CPU,
    )
    before = t.offload  # not taken before the log has it
    assert t.handle(Recorded(True)) == [Retry("oom-retry")]
    assert (before, t.offload) == (None, degrade.plan)  # kept for every later start
    (second,) = fail(t, launched=degrade.plan, panic=OOM)
    assert isinstance(second, RecordDegrade) and second.plan.kind is Offload.ENGINE_DECIDES
    assert t.handle(Recorded(True)) == [Retry("oom-retry")]
    # the bottom of the ladder: no plan left; the sweep is the next hope (and then none)
    assert fail(t, launched=second.plan, panic=OOM) == [
        AskSweep("m: exited (exit code 1) before becoming ready")
    ]


def test_an_unrecorded_step_is_not_taken() -> None:
    t = tries()
    fail(t, launched=WHOLE, panic=OOM)
    assert t.handle(Recorded(False)) == [GiveUp()]
    assert t.offload is None
    assert t.handle(Recorded(True)) == [GiveUp()]  # nothing pending any more


def test_no_ladder_when_pinned_without_a_plan_or_for_another_panic() -> None:
    message = "m: exited (exit code 1) before becoming ready"
    assert fail(tries(pinned=True), launched=WHOLE, panic=OOM) == [AskSweep(message)]
    assert fail(tries(), launched=None, panic=OOM) == [AskSweep(message)]
    assert fail(tries(), launched=WHOLE, panic="illegal-instruction") == [AskSweep(message)]
    assert fail(tries(), launched=WHOLE, panic=None) == [AskSweep(message)]


def test_one_sweep_per_ensure_and_only_when_it_stopped_something() -> None:
    t = tries()
    (ask,) = fail(t, launched=None, panic=None)
    assert ask == AskSweep("m: exited (exit code 1) before becoming ready")
    assert t.handle(SweepAnswered(True)) == [Sweep(ARGV)]
    assert t.handle(Swept(2)) == [Retry("resweep-retry")]
    assert fail(t, launched=None, panic=None) == [GiveUp()]  # swept once already
    t.handle(EnsureBegan(can_sweep=True))
    assert fail(t, launched=None, panic=None)[0] == ask  # a new ensure_running: one more
    assert t.handle(SweepAnswered(True)) == [Sweep(ARGV)]
    assert t.handle(Swept(0)) == [GiveUp()]
    t.handle(EnsureBegan(can_sweep=True))
    fail(t, launched=None, panic=None)
    assert t.handle(SweepAnswered(False)) == [GiveUp()]


def test_no_sweep_after_a_timeout_without_owned_pids_or_for_another_error() -> None:
    assert fail(tries(), launched=None, panic=None, timed_out=True) == [GiveUp()]
    unknown = StartTries(offload=None, pinned=False)
    unknown.handle(EnsureBegan(can_sweep=False))
    assert fail(unknown, launched=None, panic=None) == [GiveUp()]
    assert fail(tries(), launched=WHOLE, panic=OOM, start_error=False) == [GiveUp()]


def test_a_start_that_never_launched_has_no_facts_from_the_last_one() -> None:
    t = tries()
    fail(t, launched=WHOLE, panic=OOM)
    t.handle(Recorded(False))
    assert t.handle(AttemptBegan()) == []
    # failed before its command was built: neither the ladder nor a sweep has anything to go on
    assert t.handle(StartFailed(True, "m: cannot run llama-server (No such file)")) == [GiveUp()]


def test_a_plan_given_at_construction_is_the_one_kept() -> None:
    plan = OffloadPlan(Offload.ALL_EXPERTS_CPU, None, "from the log")
    assert StartTries(offload=plan, pinned=False).offload == plan


def sigill(t: StartTries, *, kv_type: str | None) -> list[object]:
    assert t.handle(AttemptBegan()) == []
    assert t.handle(Launched(None, ARGV, kv_type)) == []
    assert t.handle(StartEnded(None, timed_out=False, signal=SIGILL)) == []
    return list(t.handle(StartFailed(True, "m: exited (signal 4) before becoming ready")))


def test_sigill_with_a_quantized_kv_cache_is_tried_once_more_at_f16_once_recorded() -> None:
    """L22: the cache is the suspect; the retry waits for its record (unrecorded, not taken)."""
    t = tries()
    assert sigill(t, kv_type="q8_0") == [RecordCpuLimit("quantized-kv", "q8_0")]
    before = t.kv_type  # not taken before the log has it
    assert t.handle(Recorded(True)) == [Retry("cpu-retry")]
    assert (before, t.kv_type) == (None, FALLBACK_KV) and FALLBACK_KV == "f16"  # kept after
    # the retry at f16 dies the same way: the weights are the suspect, and that is the end
    assert sigill(t, kv_type="f16") == [RecordCpuLimit("weights", "f16")]
    assert t.handle(Recorded(True)) == [GiveUp()]


def test_sigill_with_f16_kv_is_the_weights_and_never_retried() -> None:
    t = tries()
    assert sigill(t, kv_type="f16") == [RecordCpuLimit("weights", "f16")]
    assert t.handle(Recorded(True)) == [GiveUp()]
    assert t.kv_type is None
    t2 = tries()
    assert sigill(t2, kv_type=None) == [RecordCpuLimit("weights", "f16")]  # the engine's own


def test_an_unrecorded_cpu_limit_is_not_acted_on() -> None:
    t = tries()
    assert sigill(t, kv_type="q4_0") == [RecordCpuLimit("quantized-kv", "q4_0")]
    assert t.handle(Recorded(False)) == [GiveUp()]
    assert t.kv_type is None


def test_another_signal_is_no_cpu_limit() -> None:
    t = tries()
    assert t.handle(AttemptBegan()) == []
    assert t.handle(Launched(None, ARGV, "q8_0")) == []
    assert t.handle(StartEnded(None, timed_out=False, signal=9)) == []
    assert t.handle(StartFailed(True, "m: exited (signal 9)")) == [AskSweep("m: exited (signal 9)")]
