"""Answers vote by the number they mean (`services.answers.answer_key`), read by the
bounded parser, so an answer such as `1e30000000` is keyed in bounded time; and that one
reading of "what number is this answer" (`answer_number`) is the one the vote, the
verifier's step checks and the evaluation all use."""

from __future__ import annotations

import time
from fractions import Fraction

import pytest

import evals.extract
import evals.votes
import orchestrator.service
import verifier.symbolic
from services import answers
from services.answers import answer_key
from services.claims import Step, plan_claim
from verifier.symbolic import check


@pytest.mark.unit
@pytest.mark.parametrize(
    "same", [["72", "72.0", "72.00", " 72 ", '"72"', "72."], ["1,234", "1234"], ["$5", "5"]]
)
def test_answers_meaning_the_same_number_vote_together(same: list[str]) -> None:
    assert len({answer_key(a) for a in same}) == 1


@pytest.mark.unit
def test_other_answers_keep_apart_and_text_is_normalized() -> None:
    assert answer_key("72") != answer_key("73")
    assert answer_key("1,2") != answer_key("12")
    assert answer_key(" Paris ") == answer_key("paris")
    assert answer_key(None) is None


@pytest.mark.unit
@pytest.mark.parametrize("answer", ["1e3000000", "-1e3000000", "1e-3000000", "9" * 20_000])
def test_a_huge_number_is_keyed_fast(answer: str) -> None:
    # CPU time, so a busy machine cannot fail it; Fraction("1e3000000") alone takes ~1 s
    start = time.process_time()
    key = answer_key(answer)
    assert time.process_time() - start < 0.25
    assert key == answer_key(answer) and key != answer_key("1")


@pytest.mark.unit
@pytest.mark.parametrize(
    ("text", "value"),
    [
        ("72", Fraction(72)),
        (" 72.0 ", Fraction(72)),
        ('"72"', Fraction(72)),
        ("72.", Fraction(72)),
        ("$72", Fraction(72)),
        ("1,234", Fraction(1234)),
        ("-3/4", Fraction(-3, 4)),
        ("15%", Fraction(3, 20)),
        ("0.3333333333 (1/3)", Fraction(1, 3)),
        ("1e-05", Fraction(1, 100000)),
        ("1,2", None),
        ("72 eggs", None),
        ("Paris", None),
        ("", None),
        (None, None),
    ],
)
def test_answer_number(text: str | None, value: Fraction | None) -> None:
    assert answers.answer_number(text) == value


@pytest.mark.unit
@pytest.mark.parametrize("text", ["1e30000000", "9" * 20_000, "1e-3000000"])
def test_an_absurd_number_is_no_number_and_costs_nothing(text: str) -> None:
    start = time.process_time()
    assert answers.answer_number(text) is None
    assert time.process_time() - start < 0.25


@pytest.mark.unit
def test_every_reader_uses_the_one_parser() -> None:
    assert orchestrator.service.answer_key is answers.answer_key  # voting, what is verified
    assert evals.votes.answer_key is answers.answer_key  # replayed votes
    assert evals.extract.answer_number is answers.answer_number  # the evaluation
    assert verifier.symbolic.answer_number is answers.answer_number  # step outputs


@pytest.mark.unit
def test_the_verifier_reads_a_step_output_as_the_vote_reads_the_answer() -> None:
    # a quoted output ("790") is the answer 790 to the vote, and so to the checks
    steps = [
        Step("s1", "calc", "17*23+4", "395"),
        Step("s2", "python", "s1 * 2", '"790"'),
    ]
    assert answers.answer_key('"790"') == answers.answer_key("790")
    right = plan_claim("q", "790", "r", steps, "s2")
    result = check(right["statement"], right["context"], right["question"])
    assert result is not None and result.verdict and not result.decisive
    wrong = plan_claim("q", "791", "r", steps, "s2")
    result = check(wrong["statement"], wrong["context"], wrong["question"])
    assert result is not None and result.decisive and not result.verdict


@pytest.mark.unit
def test_the_evaluation_reads_the_last_number_with_the_parser() -> None:
    text = "so she has 1,234.50 dollars"
    number = answers.last_number(text)
    assert number == "1234.50"
    assert evals.extract.extract_number(text) == float(answers.answer_number(number))


WHOLE_QUESTION = "Natalia sold clips to 48 of her friends in April, and 15% more in May."


@pytest.mark.unit
@pytest.mark.parametrize(
    ("answer", "question", "weight"),
    [
        ("72", WHOLE_QUESTION, 1.0),
        ("72.0", WHOLE_QUESTION, 1.0),
        ("$1,234", WHOLE_QUESTION, 1.0),
        ("15%", WHOLE_QUESTION, 1.0),  # a whole percent, as written
        ("72.5", WHOLE_QUESTION, answers.NOT_WHOLE_WEIGHT),
        ("1/3", WHOLE_QUESTION, answers.NOT_WHOLE_WEIGHT),
        ("12.5%", WHOLE_QUESTION, answers.NOT_WHOLE_WEIGHT),
        ("Paris", WHOLE_QUESTION, 1.0),  # not a number: nothing to weigh
        (None, WHOLE_QUESTION, 1.0),
        ("2.5", "Each pen costs $2.50. How much do 3 pens cost?", 1.0),  # a decimal stated
        ("2.5", "What is half of five?", 1.0),  # no number stated: no evidence
        ("4.5", "Tom ate 1/2 of 9 pies. How many did he eat?", 1.0),  # a fraction stated
        ("4.5", "Tom ate 1 / 2 of 9 pies. How many did he eat?", 1.0),
        ("7.5", "A recipe needs 2 ½ cups for 3 cakes. How many for 9 cakes?", 1.0),
        ("4.5", "Tom ate 3 of 9 pies. How many are left per 2 plates?", answers.NOT_WHOLE_WEIGHT),
        ("1e30000000", WHOLE_QUESTION, 1.0),  # no number (the bounded parser): counts 1
    ],
)
def test_a_number_that_is_not_whole_counts_half_for_a_question_of_whole_numbers(
    answer: str | None, question: str, weight: float
) -> None:
    assert answers.vote_weight(answer, question) == weight


@pytest.mark.unit
def test_the_replayed_vote_and_the_served_vote_weigh_answers_alike() -> None:
    assert evals.votes.vote_weight is answers.vote_weight
    assert orchestrator.service.vote_weight is answers.vote_weight


@pytest.mark.unit
@pytest.mark.parametrize(
    ("noisy", "meant"),
    [
        ("798.6000000000003", "798.6"),  # a program's float arithmetic, 16 digits
        ("798.6000000000001", "798.6000000000003"),
        ("-0.30000000000000004", "-0.3"),
        ("0.7999999999999999", "0.8"),
        ("15.000000000000002%", "15%"),
        ("30.000000000000004", "30"),
    ],
)
def test_a_programs_float_noise_does_not_split_the_vote(noisy: str, meant: str) -> None:
    assert answers.answer_key(noisy) == answers.answer_key(meant)


@pytest.mark.unit
@pytest.mark.parametrize(
    ("one", "other"),
    [
        ("1234567890123.5", "1234567890123"),  # 14 digits: as written
        ("0.333333333333333", "0.333333333333334"),  # 15 digits: as written
        ("123456789012345678", "123456789012345679"),  # whole: exact, however long
        ("1/3", "0.3333333333333333"),  # a fraction is not a decimal
    ],
)
def test_answers_a_float_tells_apart_still_vote_apart(one: str, other: str) -> None:
    assert answers.answer_key(one) != answers.answer_key(other)


@pytest.mark.unit
def test_a_whole_answer_with_float_noise_counts_whole_and_the_exact_reading_stays() -> None:
    assert answers.vote_weight("30.000000000000004", WHOLE_QUESTION) == 1.0
    assert answers.vote_weight("30.5", WHOLE_QUESTION) == answers.NOT_WHOLE_WEIGHT
    # what the evaluation and the symbolic checks read is the number as written
    assert answers.answer_number("30.000000000000004") == Fraction("30.000000000000004")
