"""Read a plan out of a free-text draft (the `draft` plan format).

A draft is model output: a few sentences of thinking, then either a python code block
(the program of a one-step python plan) or a JSON code block holding a whole plan. What
comes out is validated like any plan (schema and DAG); a draft that holds neither is
refused with `PlanInvalid`. The planner then asks for the program of a draft written in
prose only (`DraftWithoutCode`), and transcribes any other unreadable draft into a JSON
plan under the grammar.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Collection

from services.errors import PlanInvalid
from services.plans import check_plan, parse_plan
from services.schemas import MAX_STEP_INPUT_CHARS, PLAN_REASONING_CHARS, Plan, PlanStep
from services.toolspecs import python_gives_answer

# A fenced block; the closing fence may be missing when the draft ran to its token limit
# or the model stopped right after the code.
# The info string is anything up to the end of the fence's line (no nested quantifiers:
# a hostile draft cannot make the match backtrack).
_FENCE = re.compile(r"```([^\n`]*)\n(.*?)(?:\n[ \t]*```|\Z)", re.DOTALL)
_PYTHON = {"python", "py", "python3"}
MAX_DRAFT_CHARS = 20_000  # longer than any completion the token limit allows
# A draft's generation ends where its first code block closes: what a model writes after
# its program (an explanation, an example run) is never read, only paid for.
DRAFT_STOP = ("\n```\n",)


class DraftRefused(PlanInvalid):
    """A draft too long to read or to hold as a plan: not worth a transcription pass."""


class DraftWithoutCode(PlanInvalid):
    """A draft in prose only: the model solved the problem in words and wrote no code
    block (and no bare JSON plan)."""


def _is_python(lang: str, body: str) -> bool:
    if lang in _PYTHON:
        return bool(body.strip())
    if lang or not body.strip():
        return False
    try:  # a block without a language tag is python when it parses as python
        ast.parse(body)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return False
    return True


def plan_from_draft(text: str, tool_names: Collection[str]) -> Plan:
    """The plan a draft states, or `PlanInvalid` saying why there is none.

    The thinking before the first code block becomes the plan's `reasoning`. The last
    python block (tagged python, or untagged and parsing as python) is the program: the
    planner stops generation where the first block closes, but another backend may not;
    a JSON block is read as the whole plan. `DraftRefused` (too long) is not worth
    transcribing; other `PlanInvalid`s are.
    """
    if len(text) > MAX_DRAFT_CHARS:
        raise DraftRefused("the draft is too long to read")
    blocks = [(m.group(1).strip().lower(), m.group(2), m.start()) for m in _FENCE.finditer(text)]
    if not blocks:
        stripped = text.strip()
        if stripped.startswith("{"):  # a bare JSON plan instead of a draft
            return parse_plan(stripped, tool_names)
        raise DraftWithoutCode("the draft has no code block")
    reasoning = draft_reasoning(text[: blocks[0][2]])
    python = [body for lang, body, _ in blocks if _is_python(lang, body)]
    if python and "python" in tool_names:
        code = with_answer(python[-1].strip("\n"))
        if len(code) > MAX_STEP_INPUT_CHARS:
            raise DraftRefused(
                f"the draft's program is longer than {MAX_STEP_INPUT_CHARS} characters"
            )
        plan = Plan(
            reasoning=reasoning,
            steps=[PlanStep(id="s1", tool="python", input=code, depends_on=[])],
            answer_step="s1",
        )
        check_plan(plan, tool_names)
        return plan
    for lang, body, _ in reversed(blocks):
        if lang == "json" or body.lstrip().startswith("{"):
            plan = parse_plan(body.strip(), tool_names)
            if not plan.reasoning.strip() and reasoning:
                plan = plan.model_copy(update={"reasoning": reasoning})
            return plan
    raise PlanInvalid("the draft has no python program and no JSON plan")


def with_answer(code: str) -> str:
    """The draft's program, ending so that the python tool's answer rule reads an answer.

    Coder models often end a program with the assignment of the answer (`total = a + b`)
    or with a function they never call (`def solution(): ...`), which by the rule
    (`services.toolspecs.PYTHON_ANSWER_RULE`) answers nothing. Such a program gets one
    line, `result = total` or `result = solution()` (for a function that needs no
    arguments): the convention of program-aided prompting, where the answer is the last
    quantity the program computes. Any other program is returned as written; the planner
    then asks the model again for one that answers.
    """
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return code
    if not tree.body or python_gives_answer(tree):
        return code
    last = tree.body[-1]
    answer: str | None = None
    if isinstance(last, ast.Assign):
        if len(last.targets) == 1 and isinstance(last.targets[0], ast.Name):
            answer = last.targets[0].id
    elif isinstance(last, ast.AugAssign | ast.AnnAssign):
        if isinstance(last.target, ast.Name) and not (
            isinstance(last, ast.AnnAssign) and last.value is None
        ):
            answer = last.target.id
    elif isinstance(last, ast.FunctionDef) and not _required_arguments(last.args):
        answer = f"{last.name}()"
    return code if answer is None else f"{code}\nresult = {answer}"


def _required_arguments(args: ast.arguments) -> bool:
    positional = [*args.posonlyargs, *args.args]
    keyword_defaults = [d for d in args.kw_defaults if d is None]
    return len(positional) > len(args.defaults) or bool(keyword_defaults)


def draft_reasoning(text: str) -> str:
    """The draft's thinking as one line, cut at a word boundary to the wire bound."""
    words = " ".join(text.split())
    if len(words) <= PLAN_REASONING_CHARS:
        return words
    cut = words[: PLAN_REASONING_CHARS - 1].rsplit(" ", 1)[0]
    return cut + "…"
