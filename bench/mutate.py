"""Mutation score of the pure capacity rules: do the tests notice when a rule is changed?

Run: ``python3 dev.py run python bench/mutate.py [module ...] [--max N] [--seed S]``.

For each target module of ``hostler.capacity`` (default: budget, context, kv, slots, victims,
plan, ledger) the script lists every mutation point in the module's syntax tree, samples at
most ``--max`` of them with a seeded RNG, and runs the module's fast tests once per mutant:

- comparisons: ``<`` ↔ ``<=``, ``>`` ↔ ``>=``, each also negated (``<`` → ``>=``), ``==`` ↔
  ``!=``, ``is`` ↔ ``is not``, ``in`` ↔ ``not in``;
- arithmetic (also in ``+=`` and friends): ``+`` ↔ ``-``, ``*`` ↔ ``/``, ``//`` → ``/``,
  ``%`` → ``//``, ``**`` → ``*``;
- integer constants ± 1 (booleans excluded);
- ``and`` ↔ ``or``; ``max`` ↔ ``min``; ``not x`` → ``x``.

The mutant is never written over the source: each test run is a forked child of this script
(which preloads the third-party libraries but never hostler) whose import system serves the
mutated text from a temporary file for that one module, so the worktree stays untouched even
if the script is killed. A mutant is *killed* when the tests
fail (or time out), and *survives* when they pass. Tests that run the CLI in a subprocess are
deselected (the mutant lives only in the test process). Mutants listed in :data:`EQUIVALENT`
(changes no input can observe) are reported but left out of the score.

Prints a table and survivors with their source line; ``--json FILE`` writes the details.
"""

from __future__ import annotations

import argparse
import ast
import concurrent.futures
import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import json
import multiprocessing
import os
import random
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CAPACITY = ROOT / "core" / "hostler" / "capacity"

#: The fast test files that exercise each module (CLI subprocess tests are deselected).
TESTS: dict[str, list[str]] = {
    "budget": ["tests/test_capacity_budget.py", "tests/test_capacity_edges.py"],
    "context": [
        "tests/test_planner.py",
        "tests/test_half_up.py",
        "tests/test_capacity_edges.py",
        "tests/test_context_settings.py",
    ],
    "kv": ["tests/test_planner.py", "tests/test_half_up.py", "tests/test_capacity_edges.py"],
    "slots": ["tests/test_planner.py", "tests/test_half_up.py", "tests/test_capacity_edges.py"],
    "victims": ["tests/test_ledger.py", "tests/test_capacity_edges.py"],
    "plan": [
        "tests/test_plan.py",
        "tests/test_context_settings.py",
        "tests/test_capacity_edges.py",
    ],
    "ledger": [
        "tests/test_ledger.py",
        "tests/test_planner.py",
        "tests/test_capacity_edges.py",
    ],
    "offload": ["tests/test_offload.py"],
    "kvtrade": [
        "tests/test_planner_rules.py",
        "tests/test_plan.py",
        "tests/test_capacity_edges.py",
    ],
    "swa": ["tests/test_planner_rules.py"],
    "hostler_llamacpp.flags": [
        "tests/test_llamacpp_flags.py",
        "tests/test_llamacpp_adapter.py",
        "tests/test_llamacpp_cache_reuse.py",
    ],
    "hostler_sdcpp.pricing": ["tests/test_sdcpp_pricing.py", "tests/test_sdcpp_adapter.py"],
    "policies.pool": ["tests/test_pool_policy.py"],
    "policies.arbiter": ["tests/test_arbiter_policy.py"],
    "policies.queue": ["tests/test_queue_policy.py", "tests/test_request_queue.py"],
    "policies.health": ["tests/test_health_policy.py"],
    "policies.cache": ["tests/test_cache_policy.py"],
    "postmortem.runtime_state": ["tests/test_runtime_state.py"],
    "postmortem.explain": ["tests/test_explain.py"],
    "postmortem.verify": ["tests/test_verify_rules.py"],
    "postmortem.whatif": ["tests/test_whatif.py"],
    "postmortem.workload": ["tests/test_whatif.py"],
    "postmortem.figures": ["tests/test_whatif.py"],
    "postmortem.timeline": ["tests/test_timeline.py", "tests/test_pictures.py"],
    "postmortem.lanes": ["tests/test_pictures.py"],
    "hostler_ds4.rules": ["tests/test_ds4_rules.py"],
    "hostler_mlx.geometry": ["tests/test_mlx_adapter.py"],
    "hostler_mlx.pricing": ["tests/test_mlx_adapter.py"],
    "postmortem.redact": ["tests/test_redact.py"],
    "postmortem.exchange": ["tests/test_exchange.py"],
}
DEFAULT_MODULES = list(TESTS)
#: ledger.py: only its pure functions (module-level ``def``s) are mutated.
FUNCTIONS_ONLY = {"ledger"}

#: Mutants no input can tell apart from the original, by (module, line, mutation). Each is
#: argued in docs/benchmarks.md; they are reported, and excluded from the score.
EQUIVALENT: dict[tuple[str, int, str], str] = {
    ("policies.cache", 101, "const 0 -> -1 @12"): (
        "the priority rank only has to put normal before low: -1 < 1 orders them the same"
    ),
    ("policies.cache", 101, "const 1 -> 2 @49"): (
        "the priority rank only has to put normal before low: 0 < 2 orders them the same"
    ),
    ("offload", 77, "const 0 -> -1 @14"): "the kv default of -1 is clamped to 0 by max(kv, 0)",
    ("policies.pool", 182, "const 0 -> -1 @47"): (
        "a missing session count read as -1 is clamped to 0 by the max() around it"
    ),
    ("policies.queue", 156, "const 1 -> 2 @44"): (
        "a configured width of 1 or 2 is below W + 1 >= 2 for every engine: max() drops it"
    ),
    ("policies.queue", 156, "const 1 -> 0 @44"): (
        "a configured width of 0 or 1 is below W + 1 >= 2 for every engine: max() drops it"
    ),
    ("policies.queue", 237, "compare #0 > -> >= @45"): (
        "with cap 0 the slice kept[len(kept):] is empty too"
    ),
    ("policies.queue", 237, "const 0 -> -1 @51"): (
        "with cap 0 the slice kept[len(kept):] is empty too"
    ),
    ("postmortem.verify", 312, "const 0 -> 1 @40"): (
        "pick_replica reads each replica's key and draining flag, never its bytes"
    ),
    ("postmortem.verify", 312, "const 0 -> -1 @40"): (
        "pick_replica reads each replica's key and draining flag, never its bytes"
    ),
    ("postmortem.verify", 438, "const 0 -> 1 @44"): (
        "plan_eviction orders and sums by bytes and last use, never by token count"
    ),
    ("postmortem.verify", 438, "const 0 -> -1 @44"): (
        "plan_eviction orders and sums by bytes and last use, never by token count"
    ),
    ("budget", 95, "const 0 -> -1 @45"): "without a card has_card is False before vram is read",
    ("budget", 117, "const 0 -> -1 @36"): "a discrete host has vram > 0: the `or` never applies",
    ("budget", 117, "const 0 -> 1 @36"): "a discrete host has vram > 0: the `or` never applies",
    ("budget", 146, "arith - -> + @42"): (
        "the fast budget is already at most RAM - 4 GiB, and min(fast, ...) drops the term"
    ),
    ("budget", 150, "call min -> max @17"): (
        "off unified hosts the fast budget IS that term (the VRAM, or the RAM share)"
    ),
    ("context", 95, "compare #0 < -> <= @57"): (
        "an explicit window equal to the floor lowers the floor to itself"
    ),
    ("context", 132, "compare #0 <= -> < @28"): (
        "at requested == floor the clamp returns max(floor, ...) >= requested: unchanged"
    ),
    ("context", 142, "const 0 -> -1 @23"): (
        "an allowance in (-1, 0] gives a per-slot window <= 0 either way: the result is the floor"
    ),
    ("context", 179, "const 0 -> -1 @16"): "the clamp only ever uses max(0, vram)",
    ("context", 143, "const 0 -> -1 @13"): (
        "with no allowance the result is max(floor, min(requested, 0 or -1)): the floor (>= 0)"
    ),
    ("context", 204, "const 1 -> 0 @22"): "the clamp counts 0 slots as max(1, 0) = 1",
    ("context", 252, "const 0 -> -1 @39"): "the clamp only ever uses max(0, vram)",
    ("context", 259, "const 1 -> 2 @60"): (
        "with two slots the trade loop's range(1, 1, -1) is empty too (never below 2 slots)"
    ),
    ("context", 260, "const 1 -> 0 @38"): (
        "a best window starting at 0 instead of -1 only skips a 0-token trade, which is never "
        "taken (the result is never below the base)"
    ),
    ("context", 265, "compare #0 >= -> > @15"): (
        "windows are capped at the target, so once one reaches it no later count can beat it: "
        "not breaking changes nothing"
    ),
    ("context", 251, "const 0 -> -1 @21"): (
        "on a card the live half is vram + max(0, free - 2 GiB): any free <= 2 GiB adds nothing"
    ),
    ("context", 251, "const 0 -> 1 @21"): (
        "on a card the live half is vram + max(0, free - 2 GiB): any free <= 2 GiB adds nothing"
    ),
    ("context", 259, "const 1 -> 0 @60"): (
        "with one slot the trade loop's range(0, 0, -1) is empty: nothing to trade either way"
    ),
    ("kv", 134, "const 1 -> 0 @31"): (
        "an interval of 1 makes every layer full ((i + 1) % 1 == 0): the same count as all"
    ),
    ("slots", 45, "compare #0 > -> >= @30"): (
        "0 is already refused by the truthiness test before it: the heuristic either way"
    ),
    ("slots", 45, "const 0 -> -1 @51"): "no int lies between -1 and 0: the heuristic either way",
    ("victims", 53, "compare #0 <= -> < @7"): (
        "a shortfall of 0 stops the loop before its first pick: the same empty, covering plan"
    ),
    ("victims", 53, "const 0 -> -1 @20"): (
        "a shortfall of 0 stops the loop before its first pick: the same empty, covering plan"
    ),
    ("plan", 201, "const 0 -> -1 @40"): "the clamp only ever uses max(0, vram)",
    ("ledger", 135, "const 0 -> -1 @16"): (
        "others is max(0, ...): at others == 0 the co-residency term is min(0, ...) <= 0"
    ),
    ("ledger", 135, "compare #0 > -> >= @7"): (
        "at others == 0 the co-residency term is min(0, ...) <= 0: the same max"
    ),
    ("ledger", 251, "const 0 -> 1 @20"): "0 and 1 byte both read 0.0 GiB in the denial text",
}

_COMPARE_SWAPS: dict[type[ast.cmpop], list[type[ast.cmpop]]] = {
    ast.Lt: [ast.LtE, ast.GtE],
    ast.LtE: [ast.Lt, ast.Gt],
    ast.Gt: [ast.GtE, ast.LtE],
    ast.GtE: [ast.Gt, ast.Lt],
    ast.Eq: [ast.NotEq],
    ast.NotEq: [ast.Eq],
    ast.Is: [ast.IsNot],
    ast.IsNot: [ast.Is],
    ast.In: [ast.NotIn],
    ast.NotIn: [ast.In],
}
_BINOP_SWAPS: dict[type[ast.operator], type[ast.operator]] = {
    ast.Add: ast.Sub,
    ast.Sub: ast.Add,
    ast.Mult: ast.Div,
    ast.Div: ast.Mult,
    ast.FloorDiv: ast.Div,
    ast.Mod: ast.FloorDiv,
    ast.Pow: ast.Mult,
}
_SYMBOL = {
    ast.Lt: "<",
    ast.LtE: "<=",
    ast.Gt: ">",
    ast.GtE: ">=",
    ast.Eq: "==",
    ast.NotEq: "!=",
    ast.Is: "is",
    ast.IsNot: "is not",
    ast.In: "in",
    ast.NotIn: "not in",
    ast.Add: "+",
    ast.Sub: "-",
    ast.Mult: "*",
    ast.Div: "/",
    ast.FloorDiv: "//",
    ast.Mod: "%",
    ast.Pow: "**",
    ast.And: "and",
    ast.Or: "or",
}

_CMPOP_BY_SYMBOL: dict[str, type[ast.cmpop]] = {_SYMBOL[op]: op for op in _COMPARE_SWAPS}


@dataclass(frozen=True)
class Mutation:
    """One change at one point: the node's index in ``ast.walk`` order and what to do."""

    index: int
    line: int
    col: int
    kind: str
    detail: str

    @property
    def label(self) -> str:
        """``kind detail @column`` as a person reads it (the column tells same-line points
        apart)."""
        return f"{self.kind} {self.detail} @{self.col}"


@dataclass
class Outcome:
    """What the tests said about one mutant."""

    module: str
    line: int
    mutation: str
    source_line: str
    killed: bool
    how: str
    equivalent: str = ""


def _in_scope(tree: ast.Module, functions_only: bool) -> set[int]:
    """ids of the nodes that may be mutated (skip annotations, docstrings, ``__all__``)."""
    scope: set[int] = set()
    roots: list[ast.AST] = [tree]
    if functions_only:
        roots = [n for n in tree.body if isinstance(n, ast.FunctionDef)]
    skipped: set[int] = set()
    for node in ast.walk(tree):
        for annotation in _annotations(node):
            skipped.update(id(n) for n in ast.walk(annotation))
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
        ):
            skipped.update(id(n) for n in ast.walk(node))
    for root in roots:
        scope.update(id(n) for n in ast.walk(root) if id(n) not in skipped)
    return scope


def _annotations(node: ast.AST) -> list[ast.expr]:
    found: list[ast.expr] = []
    if isinstance(node, ast.AnnAssign):
        found.append(node.annotation)
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.returns is not None:
        found.append(node.returns)
    if isinstance(node, ast.arg) and node.annotation is not None:
        found.append(node.annotation)
    return found


def mutations_of(tree: ast.Module, functions_only: bool = False) -> list[Mutation]:
    """Every mutation point of a module, in a stable order."""
    scope = _in_scope(tree, functions_only)
    found: list[Mutation] = []
    for index, node in enumerate(ast.walk(tree)):
        if id(node) not in scope:
            continue
        line = getattr(node, "lineno", 0)
        col = getattr(node, "col_offset", 0)
        if isinstance(node, ast.Compare):
            for position, op in enumerate(node.ops):
                for swap in _COMPARE_SWAPS.get(type(op), []):
                    detail = f"#{position} {_SYMBOL[type(op)]} -> {_SYMBOL[swap]}"
                    found.append(Mutation(index, line, col, "compare", detail))
        elif isinstance(node, (ast.BinOp, ast.AugAssign)):
            swap_op = _BINOP_SWAPS.get(type(node.op))
            if swap_op is not None:
                detail = f"{_SYMBOL[type(node.op)]} -> {_SYMBOL[swap_op]}"
                found.append(Mutation(index, line, col, "arith", detail))
        elif isinstance(node, ast.Constant) and type(node.value) is int:
            found.append(Mutation(index, line, col, "const", f"{node.value} -> {node.value + 1}"))
            found.append(Mutation(index, line, col, "const", f"{node.value} -> {node.value - 1}"))
        elif isinstance(node, ast.BoolOp):
            other = "or" if isinstance(node.op, ast.And) else "and"
            found.append(Mutation(index, line, col, "bool", f"{_SYMBOL[type(node.op)]} -> {other}"))
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in {"max", "min"}
        ):
            other = "min" if node.func.id == "max" else "max"
            found.append(Mutation(index, line, col, "call", f"{node.func.id} -> {other}"))
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            found.append(Mutation(index, line, col, "not", "not x -> x"))
    return found


class _Apply(ast.NodeTransformer):
    def __init__(self, target: ast.AST, mutation: Mutation) -> None:
        self.target = target
        self.mutation = mutation

    def visit(self, node: ast.AST) -> ast.AST:
        if node is not self.target:
            return super().visit(node)
        m = self.mutation
        if isinstance(node, ast.Compare):
            position = int(m.detail.split()[0][1:])
            wanted = m.detail.split(" -> ")[1]
            node.ops[position] = _CMPOP_BY_SYMBOL[wanted]()
        elif isinstance(node, (ast.BinOp, ast.AugAssign)):
            node.op = _BINOP_SWAPS[type(node.op)]()
        elif isinstance(node, ast.Constant):
            node.value = int(m.detail.split(" -> ")[1])
        elif isinstance(node, ast.BoolOp):
            node.op = ast.Or() if isinstance(node.op, ast.And) else ast.And()
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            node.func = ast.Name("min" if node.func.id == "max" else "max", ast.Load())
        elif isinstance(node, ast.UnaryOp):
            return node.operand
        return node


def mutant_source(source: str, mutation: Mutation) -> str:
    """The module's text with one mutation applied."""
    tree = ast.parse(source)
    target = list(ast.walk(tree))[mutation.index]
    mutated = _Apply(target, mutation).visit(tree)
    return ast.unparse(ast.fix_missing_locations(mutated))


#: Third-party modules every run imports: loaded once in this process, inherited by each
#: forked run, so a run pays for hostler and the tests only. hostler itself is never imported
#: here (each run must import the mutant).
_PRELOAD = (
    "pytest",
    "sqlalchemy",
    "alembic.runtime.environment",
    "alembic.runtime.migration",
    "numpy",
    "gguf",
    "psutil",
    "pluggy",
    "transitions",
)


class _MutantFinder(importlib.abc.MetaPathFinder):
    """Serves one module's source from another file."""

    def __init__(self, fullname: str, path: Path) -> None:
        self.fullname = fullname
        self.path = path

    def find_spec(
        self, fullname: str, path: object = None, target: object = None
    ) -> importlib.machinery.ModuleSpec | None:
        """The mutant's spec for the one module, else None (the normal finders go on)."""
        del path, target
        if fullname != self.fullname:
            return None
        return importlib.util.spec_from_file_location(fullname, self.path)


def _child(fullname: str, path: Path, args: list[str]) -> None:
    """In the forked run: serve the mutant, run pytest quietly, exit with its status."""
    if not os.environ.get("MUTATE_VERBOSE"):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.dup2(devnull, 2)
    os.chdir(ROOT)
    sys.meta_path.insert(0, _MutantFinder(fullname, path))
    import pytest

    os._exit(int(pytest.main(args)))


def _dotted(module: str) -> str:
    """``budget`` is ``hostler.capacity.budget``; ``policies.pool`` is ``hostler.policies.pool``.

    A plugin's module is named in full (``hostler_llamacpp.flags``).
    """
    if module.startswith("hostler_"):
        return module
    return f"hostler.{module}" if "." in module else f"hostler.capacity.{module}"


def _source_path(module: str) -> Path:
    top = "plugins" if module.startswith("hostler_") else "core"
    return ROOT / top / Path(*_dotted(module).split(".")).with_suffix(".py")


def run_tests(module: str, text: str, tests: list[str], timeout: float) -> tuple[bool, str]:
    """Run ``tests`` against ``text`` standing in for ``hostler.capacity.<module>``.

    Each run is a forked child of this process (which never imports hostler), so the worktree
    is never written and a killed script leaves nothing behind. Returns (passed, how): how is
    ``passed``, ``failed`` or ``timeout``.
    """
    args = ["-x", "-q", "-p", "no:cacheprovider", "-m", "not static", "-k", "not cli", *tests]
    with tempfile.TemporaryDirectory(prefix="hostler-mutant-") as tmp:
        path = Path(tmp) / f"{module.rsplit('.', 1)[-1]}.py"
        path.write_text(text, encoding="utf-8")
        context = multiprocessing.get_context("fork")
        child = context.Process(target=_child, args=(_dotted(module), path, args))
        child.start()
        child.join(timeout)
        if child.is_alive():
            child.kill()
            child.join()
            return False, "timeout"
    return child.exitcode == 0, "passed" if child.exitcode == 0 else "failed"


def _sample(points: list[Mutation], module: str, seed: int, limit: int) -> list[Mutation]:
    """At most ``limit`` points, drawn by an RNG seeded with ``seed`` and the module's name."""
    rng = random.Random(f"{seed}:{module}")
    return sorted(rng.sample(points, min(limit, len(points))), key=lambda m: m.index)


def mutate_module(
    module: str, *, limit: int, seed: int, jobs: int, timeout: float
) -> tuple[list[Outcome], int]:
    """Sample and run the mutants of one module; return the outcomes and the points found."""
    source = _source_path(module).read_text(encoding="utf-8")
    tests = [t for t in TESTS[module] if (ROOT / t).exists()]
    tree = ast.parse(source)
    points = mutations_of(tree, functions_only=module in FUNCTIONS_ONLY)
    sample = _sample(points, module, seed, limit)
    baseline_ok, how = run_tests(module, ast.unparse(tree), tests, timeout)
    if not baseline_ok:
        raise SystemExit(f"mutate: the unmutated {module} does not pass its tests ({how})")
    lines = source.splitlines()

    def one(mutation: Mutation) -> Outcome:
        passed, how = run_tests(module, mutant_source(source, mutation), tests, timeout)
        return Outcome(
            module=module,
            line=mutation.line,
            mutation=mutation.label,
            source_line=lines[mutation.line - 1].strip() if mutation.line else "",
            killed=not passed,
            how=how,
            equivalent=EQUIVALENT.get((module, mutation.line, mutation.label), ""),
        )

    with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
        outcomes = list(pool.map(one, sample))
    return outcomes, len(points)


def main(argv: list[str] | None = None) -> int:
    """Parse options, run every module, print the table (exit 1 under ``--fail-under``)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "modules", nargs="*", help=f"modules of hostler.capacity (default: {' '.join(TESTS)})"
    )
    parser.add_argument("--max", type=int, default=40, help="mutants sampled per module")
    parser.add_argument("--seed", type=int, default=7, help="sampling seed")
    parser.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="parallel runs")
    parser.add_argument("--timeout", type=float, default=180.0, help="seconds per test run")
    parser.add_argument("--json", type=Path, help="write every outcome here")
    parser.add_argument(
        "--list", action="store_true", help="list the sampled mutants and exit (no test runs)"
    )
    parser.add_argument(
        "--fail-under", type=float, default=0.0, help="exit 1 if a module scores below (%%)"
    )
    args = parser.parse_args(argv)
    if args.max < 1:
        parser.error("--max must be at least 1")
    unknown = [m for m in args.modules if m not in TESTS]
    if unknown:
        parser.error(f"unknown module(s) {', '.join(unknown)}; choose from {', '.join(TESTS)}")
    args.modules = args.modules or DEFAULT_MODULES
    if args.list:
        for module in dict.fromkeys(args.modules):
            source = _source_path(module).read_text(encoding="utf-8")
            points = mutations_of(ast.parse(source), functions_only=module in FUNCTIONS_ONLY)
            lines = source.splitlines()
            for m in _sample(points, module, args.seed, args.max):
                print(f"{module}.py:{m.line}  {m.label:<28} {lines[m.line - 1].strip()}")
        return 0
    for name in _PRELOAD:
        importlib.import_module(name)
    started = time.monotonic()
    report: dict[str, object] = {"seed": args.seed, "max": args.max, "modules": {}}
    worst = 100.0
    print(f"seed {args.seed}, at most {args.max} mutants per module, {args.jobs} job(s)")
    print(f"{'module':<10} {'points':>6} {'sampled':>7} {'killed':>6} {'equiv':>5} {'score':>7}")
    for module in dict.fromkeys(args.modules):
        outcomes, points = mutate_module(
            module, limit=args.max, seed=args.seed, jobs=args.jobs, timeout=args.timeout
        )
        counted = [o for o in outcomes if not o.equivalent]
        killed = sum(o.killed for o in counted)
        equivalent = len(outcomes) - len(counted)
        score = 100.0 * killed / len(counted) if counted else 100.0
        worst = min(worst, score)
        print(
            f"{module:<10} {points:>6} {len(outcomes):>7} {killed:>6} {equivalent:>5} "
            f"{score:>6.1f}%",
            flush=True,
        )
        for o in counted:
            if not o.killed:
                print(f"  survived  {o.module}.py:{o.line}  {o.mutation:<24} {o.source_line}")
        for o in outcomes:
            if o.equivalent:
                print(f"  equivalent {o.module}.py:{o.line}  {o.mutation:<24} {o.equivalent}")
        modules = report["modules"]
        assert isinstance(modules, dict)
        modules[module] = {
            "points": points,
            "sampled": len(outcomes),
            "killed": killed,
            "equivalent": equivalent,
            "score": round(score, 1),
            "outcomes": [asdict(o) for o in outcomes],
        }
    print(f"{time.monotonic() - started:.0f} s")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    return 1 if worst < args.fail_under else 0


if __name__ == "__main__":
    sys.exit(main())
