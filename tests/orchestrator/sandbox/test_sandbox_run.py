"""What the `python` tool relies on: values in, result/stdout/error out, limits, pool."""

from __future__ import annotations

import asyncio
import os
import signal
from typing import Any

import pytest
from structlog.testing import capture_logs

from orchestrator.sandbox import Sandbox, SandboxSettings, SandboxUnavailableError

pytestmark = pytest.mark.asyncio(loop_scope="module")

GSM8K_STYLE = """
from fractions import Fraction
import math
eggs_per_day = 16
eaten = 3
baked = 4
price = Fraction(2)
result = (eggs_per_day - eaten - baked) * price
print(f"sold {eggs_per_day - eaten - baked} eggs for {float(result):.2f}")
"""


@pytest.mark.integration
async def test_values_are_bound_as_variables(sandbox: Sandbox) -> None:
    outcome = await sandbox.run("s1 + s2 * 2", {"s1": 2, "s2": 3}, 5.0)
    assert (outcome.status, outcome.result) == ("ok", 8)
    outcome = await sandbox.run("s1['a'][1] + len(s2)", {"s1": {"a": [1, 41]}, "s2": "xy"}, 5.0)
    assert outcome.result == 43


@pytest.mark.integration
async def test_values_are_data_not_source(sandbox: Sandbox) -> None:
    hostile = "__import__('os').system('id')"
    outcome = await sandbox.run("s1", {"s1": hostile}, 5.0)
    assert (outcome.status, outcome.result) == ("ok", hostile)


@pytest.mark.integration
async def test_last_expression_wins_over_result_variable(sandbox: Sandbox) -> None:
    # services.toolspecs.PYTHON_ANSWER_RULE (test_answer_rule.py has every case)
    outcome = await sandbox.run("result = 3\nresult * 100", {}, 5.0)
    assert outcome.result == 300
    outcome = await sandbox.run("result = 3\nprint(result)", {}, 5.0)
    assert outcome.result == 3
    outcome = await sandbox.run("x = 5\nx * 2", {}, 5.0)
    assert outcome.result == 10
    outcome = await sandbox.run("x = 5", {}, 5.0)
    assert (outcome.status, outcome.result) == ("ok", None)
    # `result` inside a function is a local, not the program's result.
    outcome = await sandbox.run("def f():\n    result = 1\n    return 2\nf()", {}, 5.0)
    assert outcome.result == 2


@pytest.mark.integration
async def test_gsm8k_style_program(sandbox: Sandbox) -> None:
    outcome = await sandbox.run(GSM8K_STYLE, {}, 5.0)
    assert outcome.status == "ok", outcome
    assert outcome.result == 18
    assert outcome.stdout == "sold 9 eggs for 18.00\n"


@pytest.mark.integration
@pytest.mark.parametrize(
    ("code", "expected"),
    [
        ("from fractions import Fraction\nFraction(3, 4)", "3/4"),
        ("from fractions import Fraction\nFraction(4, 2)", 2),
        ("from decimal import Decimal\nDecimal('2.50')", "2.50"),
        ("from decimal import Decimal\nDecimal('3.000')", 3),
        ("0.5", 0.5),
        ("float('nan')", "nan"),
        ("{3, 1, 2}", [1, 2, 3]),
        ("(1, (2, 3))", [1, [2, 3]]),
        ("{1: 'a'}", {"1": "a"}),
        ("import datetime\ndatetime.date(2024, 2, 29)", "2024-02-29"),
        ("2**100", 2**100),
        ("True", True),
        ("1j", "1j"),
        ("range(3)", [0, 1, 2]),
    ],
)
async def test_results_are_json_safe(sandbox: Sandbox, code: str, expected: Any) -> None:
    outcome = await sandbox.run(code, {}, 5.0)
    assert outcome.status == "ok", outcome
    assert outcome.result == expected


@pytest.mark.integration
async def test_big_integers_within_the_cap(sandbox: Sandbox) -> None:
    outcome = await sandbox.run("2**20000", {}, 5.0)
    # Longer than the interpreter's int/str limit: returned as its decimal digits.
    assert outcome.status == "ok"
    assert isinstance(outcome.result, str) and len(outcome.result) == 6021
    assert outcome.result.startswith("39802768403379665923")
    outcome = await sandbox.run("10**10000 * 10", {}, 5.0)
    assert outcome.status == "error" and outcome.category == "output_limit"


@pytest.mark.integration
async def test_allowed_modules_work(sandbox: Sandbox) -> None:
    code = """
import math, cmath, statistics, itertools, functools, re, heapq, bisect, operator
from collections import Counter
from decimal import Decimal, getcontext
@functools.lru_cache(maxsize=None)
def fib(n):
    return n if n < 2 else fib(n - 1) + fib(n - 2)
[
    math.comb(5, 2), statistics.median([1, 3, 2]), list(itertools.islice(itertools.count(), 3)),
    fib(30), re.findall(r"\\d+", "a1b22"), heapq.nsmallest(1, [3, 1]), bisect.bisect([1, 3], 2),
    operator.itemgetter(1)([7, 8]), Counter("aab")["a"], str(Decimal(1) / Decimal(8)),
    "{:.1f}".format(2.25), f"{3:03d}", abs(cmath.sqrt(-4)),
]
"""
    outcome = await sandbox.run(code, {}, 5.0)
    assert outcome.status == "ok", outcome
    assert outcome.result == [
        10, 2, [0, 1, 2], 832040, ["1", "22"], [1], 1, 8, 2, "0.125", "2.2", "003", 2.0
    ]  # fmt: skip


# datetime's C code imports `time` (strftime, timetuple) and `_strptime` (strptime)
# through the job's `__import__`; the code itself may still not import them.
DATETIME_FORMATTING = {
    "strftime": ("import datetime\ndatetime.date(2024, 2, 29).strftime('%Y/%m/%d %a')",
                 "2024/02/29 Thu"),
    "format_spec": ("import datetime\nd = datetime.date(2024, 2, 29)\nf'{d:%Y}'", "2024"),
    "timetuple": ("import datetime\nlist(datetime.date(2024, 2, 29).timetuple())",
                  [2024, 2, 29, 0, 0, 0, 3, 60, -1]),
    "strptime": ("from datetime import datetime\n"
                 "datetime.strptime('2024-02-29 13:05', '%Y-%m-%d %H:%M').isoformat()",
                 "2024-02-29T13:05:00"),
    "strptime_twice": ("from datetime import datetime\n"
                       "[datetime.strptime(s, '%d.%m.%Y').day for s in ('1.2.2024', '3.4.2025')]",
                       [1, 3]),
    "datetime_strftime_tz": ("import datetime\n"
                             "datetime.datetime(2024, 1, 1, tzinfo=datetime.timezone.utc)"
                             ".strftime('%H:%M %z %Z')",
                             "00:00 +0000 UTC"),
}  # fmt: skip


@pytest.mark.integration
@pytest.mark.parametrize("name", sorted(DATETIME_FORMATTING))
async def test_datetime_formatting_and_parsing_work(sandbox: Sandbox, name: str) -> None:
    code, expected = DATETIME_FORMATTING[name]
    outcome = await sandbox.run(code, {}, 5.0)
    assert (outcome.status, outcome.result) == ("ok", expected), outcome


@pytest.mark.integration
@pytest.mark.parametrize("code", ["import time", "import _strptime", "from time import sleep"])
async def test_time_modules_stay_refused(sandbox: Sandbox, code: str) -> None:
    outcome = await sandbox.run(code, {}, 5.0)
    assert (outcome.status, outcome.category) == ("refused", "banned_import"), outcome


@pytest.mark.integration
async def test_stdout_is_captured_and_capped(sandbox: Sandbox) -> None:
    outcome = await sandbox.run("print('a')\nprint('b', 2)", {}, 5.0)
    assert outcome.stdout == "a\nb 2\n"
    outcome = await sandbox.run("print('x' * 20000)", {}, 5.0)
    assert outcome.status == "error" and outcome.category == "output_limit"
    assert len(outcome.stdout) == sandbox.settings.max_output_chars


@pytest.mark.integration
async def test_error_status_carries_the_exception(sandbox: Sandbox) -> None:
    outcome = await sandbox.run("x = 1\n1 / 0", {}, 5.0)
    assert outcome.status == "error"
    assert outcome.error == "ZeroDivisionError: division by zero"
    assert outcome.category is None
    outcome = await sandbox.run("undefined_name", {}, 5.0)
    assert outcome.error is not None and outcome.error.startswith("NameError")
    outcome = await sandbox.run("def f(:\n", {}, 5.0)
    assert outcome.status == "error" and outcome.category == "syntax_error"


@pytest.mark.integration
async def test_timeout_status(sandbox: Sandbox) -> None:
    outcome = await sandbox.run("while True:\n    pass", {}, 0.3)
    assert outcome.status == "timeout" and outcome.category == "timeout"
    assert 250 <= outcome.latency_ms < 2500


@pytest.mark.integration
async def test_nothing_persists_between_runs(sandbox: Sandbox) -> None:
    assert (await sandbox.run("x = 1\nimport math\nmath.pi = 3\nx", {}, 5.0)).result == 1
    outcome = await sandbox.run("x", {}, 5.0)
    assert outcome.status == "error" and "NameError" in (outcome.error or "")
    outcome = await sandbox.run("import math\nmath.pi", {}, 5.0)
    assert outcome.result == pytest.approx(3.141592653589793)


@pytest.mark.integration
async def test_bad_values_are_refused(sandbox: Sandbox) -> None:
    for values in ({"__class__": 1}, {"class": 1}, {"_x": 1}, {"a-b": 1}):
        outcome = await sandbox.run("1", values, 5.0)
        assert outcome.status == "refused" and outcome.category == "bad_input", values
    outcome = await sandbox.run("1", {"s1": object()}, 5.0)
    assert outcome.status == "error" and outcome.category == "bad_input"


# The one shape of both log lines (services/logging.py renders them as ECS JSON).
LOG_SHAPE = {
    "event", "log_level", "event.action", "event.kind", "labels.category", "labels.tool",
    "labels.status", "error.message",
}  # fmt: skip


@pytest.mark.integration
async def test_alerts_only_for_attempts_limits_logged_apart(sandbox: Sandbox) -> None:
    with capture_logs() as logs:
        await sandbox.run("().__class__", {}, 5.0)  # refused by the static check
        await sandbox.run("while True:\n    pass", {}, 0.2)
        await sandbox.run("bytearray(10**10)", {}, 5.0)
        await sandbox.run("def f(n):\n    return f(n + 1)\nf(0)", {}, 5.0)
        await sandbox.run("print('x' * 20000)", {}, 5.0)
        await sandbox.run("1 + 1", {}, 5.0)
        await sandbox.run("1 / 0", {}, 5.0)
    alerts = [entry for entry in logs if entry["event"] == "SECURITY_ALERT"]
    limits = [entry for entry in logs if entry["event"] == "tool_limit"]
    assert [alert["labels.category"] for alert in alerts] == ["dunder_access"]
    assert [limit["labels.category"] for limit in limits] == [
        "timeout", "memory", "recursion", "output_limit"
    ]  # fmt: skip
    assert len(logs) == len(alerts) + len(limits), logs
    for entry in alerts:
        assert entry["log_level"] == "warning" and entry["event.kind"] == "alert"
    for entry in limits:
        assert entry["log_level"] == "info" and entry["event.kind"] == "event"
    for entry in alerts + limits:
        assert set(entry) == LOG_SHAPE, entry
        assert entry["event.action"] == entry["event"]
        assert entry["labels.tool"] == "python" and entry["error.message"]


@pytest.mark.integration
async def test_concurrent_runs_share_the_pool(sandbox: Sandbox) -> None:
    outcomes = await asyncio.gather(*(sandbox.run(f"{i} * 2", {}, 10.0) for i in range(6)))
    assert [o.result for o in outcomes] == [0, 2, 4, 6, 8, 10]


@pytest.mark.integration
async def test_killed_worker_is_replaced(sandbox: Sandbox, check_clean: Any) -> None:
    victim = next(iter(sandbox._workers))
    os.kill(victim.proc.pid, signal.SIGKILL)
    await victim.proc.wait()
    outcomes = await asyncio.gather(*(sandbox.run("21 * 2", {}, 10.0) for _ in range(4)))
    assert all(o.result == 42 for o in outcomes), outcomes
    assert victim not in sandbox._workers
    await check_clean(sandbox)


@pytest.mark.integration
async def test_close_leaves_nothing_behind(process_tree: Any, state_of: Any) -> None:
    sb = Sandbox(SandboxSettings(workers=2))
    await sb.start()
    slow = asyncio.create_task(sb.run("while True:\n    pass", {}, 30.0))
    await asyncio.sleep(0.3)
    workers = {w.proc.pid for w in sb._workers}
    tree = workers.union(*(process_tree(pid) for pid in workers))
    # Two workers, their zygotes, a spare each and the running job.
    assert len(tree) == 7, tree
    await sb.close()
    outcome = await asyncio.wait_for(slow, 5.0)
    assert outcome.status == "error" and outcome.category == "closed", outcome
    assert {pid for pid in tree if state_of(pid) != "gone"} == set()
    with pytest.raises(SandboxUnavailableError):
        await sb.run("1", {}, 1.0)
