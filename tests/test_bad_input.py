"""Every class of bad input gets a 4xx in the one error shape, on every service."""

from __future__ import annotations

import json

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import Stack

pytestmark = [pytest.mark.integration]

GOOD = {
    "orchestrator": ("/reason", {"question": "What is 1 + 1?"}),
    "planner": ("/plan", {"question": "What is 1 + 1?"}),
    "verifier": ("/verify", {"statement": "1 + 1 = 2"}),
}


def assert_error(r: httpx.Response, status: int, error_type: str | None = None) -> dict:
    assert r.status_code == status, r.text
    body = r.json()
    assert set(body) == {"error", "trace_id"}
    assert body["trace_id"] == r.headers["x-trace-id"]
    assert isinstance(body["error"]["message"], str) and body["error"]["message"]
    assert "Traceback" not in r.text
    if error_type:
        assert body["error"]["type"] == error_type
    return body


def post_raw(stack: Stack, service: str, content: bytes | str, ctype: str = "application/json"):
    path = GOOD[service][0]
    return httpx.post(stack.url(service) + path, content=content, headers={"content-type": ctype})


@pytest.mark.parametrize("service", list(GOOD))
@pytest.mark.parametrize(
    "content",
    ['{"question": ', "not json", "", "\x00\x01", '{"a": 1}}', "[1, 2", "\ufeff{}"],
)
def test_malformed_json_is_400(stack: Stack, service: str, content: str) -> None:
    r = post_raw(stack, service, content.encode("utf-8", "surrogatepass"))
    assert r.status_code in (400, 422)
    assert_error(r, r.status_code)


@pytest.mark.parametrize("service", list(GOOD))
@pytest.mark.parametrize(
    "ctype",
    ["text/plain", "application/x-www-form-urlencoded", "", "multipart/form-data; boundary=x"],
)
def test_wrong_content_type_is_415(stack: Stack, service: str, ctype: str) -> None:
    r = post_raw(stack, service, json.dumps(GOOD[service][1]), ctype)
    assert_error(r, 415, "unsupported_media_type")


@pytest.mark.parametrize("service", list(GOOD))
def test_wrong_method_is_405_and_unknown_path_404(stack: Stack, service: str) -> None:
    path = GOOD[service][0]
    for method in ("GET", "PUT", "DELETE", "PATCH"):
        r = httpx.request(method, stack.url(service) + path, json=GOOD[service][1])
        assert_error(r, 405, "method_not_allowed")
    assert_error(httpx.get(stack.url(service) + "/nope"), 404, "not_found")


REASON_BAD = [
    ({}, "question"),
    ({"question": 12}, "question"),
    ({"question": None}, "question"),
    ({"question": ["a"]}, "question"),
    ({"question": ""}, "question"),
    ({"question": "   \n\t "}, "question"),
    ({"question": "x" * 4001}, "question"),
    ({"question": "ok", "extra": 1}, "extra"),
    ({"question": "ok", "options": {"n_plans": 0}}, "options.n_plans"),
    ({"question": "ok", "options": {"n_plans": 9}}, "options.n_plans"),
    ({"question": "ok", "options": {"n_plans": "2x"}}, "options.n_plans"),
    ({"question": "ok", "options": {"n_plans": 1.5}}, "options.n_plans"),
    ({"question": "ok", "options": {"deadline_s": 0.01}}, "options.deadline_s"),
    ({"question": "ok", "options": {"deadline_s": 121}}, "options.deadline_s"),
    ({"question": "ok", "options": {"deadline_s": "nan"}}, "options.deadline_s"),
    ({"question": "ok", "options": {"verify": "maybe"}}, "options.verify"),
    ({"question": "ok", "options": {"turbo": True}}, "options.turbo"),
    ({"question": "ok", "options": []}, "options"),
]


@pytest.mark.parametrize(("body", "param"), REASON_BAD)
def test_reason_rejects_invalid_bodies_with_the_field_named(stack: Stack, body, param) -> None:
    r = httpx.post(f"{stack.url('orchestrator')}/reason", json=body)
    err = assert_error(r, 422, "validation_error")
    assert err["error"]["param"] == param


@pytest.mark.parametrize("body", ["[]", '"question"', "1", "null", "true", "{}"])
def test_non_object_bodies_are_rejected(stack: Stack, body: str) -> None:
    r = post_raw(stack, "orchestrator", body)
    assert r.status_code in (400, 422)
    assert_error(r, r.status_code)


def test_oversized_body_is_413(stack: Stack) -> None:
    big = json.dumps({"question": "x" * 2_000_000})
    assert_error(post_raw(stack, "orchestrator", big), 413, "payload_too_large")


def test_planner_and_verifier_validate_their_bodies(stack: Stack) -> None:
    plan = stack.url("planner") + "/plan"
    assert_error(httpx.post(plan, json={"question": "q", "n": 9}), 422)
    assert_error(httpx.post(plan, json={"question": "q", "temperature": 3}), 422)
    assert_error(httpx.post(plan, json={"question": "x" * 4001}), 422)
    verify = stack.url("verifier") + "/verify"
    assert_error(httpx.post(verify, json={"statement": ""}), 422)
    assert_error(httpx.post(verify, json={"statement": "a", "bogus": 1}), 422)
    assert_error(httpx.post(verify, json={"statement": "a" * 9000}), 422)
    batch = stack.url("verifier") + "/verify/batch"
    assert_error(httpx.post(batch, json={"items": []}), 422)


def test_tool_endpoint_validates(stack: Stack) -> None:
    base = stack.url("orchestrator")
    assert_error(httpx.post(f"{base}/tools/nope/run", json={"input": "1"}), 404, "not_found")
    assert_error(httpx.post(f"{base}/tools/calc/run", json={"input": ""}), 422)
    assert_error(httpx.post(f"{base}/tools/calc/run", json={"input": "1", "timeout_s": -1}), 422)
    ok = httpx.post(f"{base}/tools/calc/run", json={"input": "6*7"})
    assert ok.status_code == 200 and ok.json()["output"] == "42"


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4)
    ),
    max_leaves=12,
)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(body=st.dictionaries(st.sampled_from(["question", "options", "n", "x"]), json_values))
def test_fuzzed_bodies_never_produce_a_server_error(stack: Stack, body: dict) -> None:
    payload = dict(body)
    if isinstance(payload.get("options"), dict):  # keep any valid request short
        payload["options"] = {**payload["options"], "deadline_s": 2}
    r = httpx.post(f"{stack.url('orchestrator')}/reason", json=payload, timeout=10)
    assert r.status_code < 500, r.text
    if r.status_code != 200:
        assert_error(r, r.status_code)
