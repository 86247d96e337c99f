import orjson
import pytest

from epp.common.requestparse import parse_prompt, parse_request
from epp.errors import BadRequestError

HEADERS = {":path": "/v1/completions?x=1", ":method": "POST"}


def test_parses_model_stream_and_path() -> None:
    body = orjson.dumps({"model": "m", "prompt": "abcd" * 10, "stream": True, "max_tokens": 7})
    req, doc = parse_request("rid", HEADERS, body)
    assert (req.model, req.path, req.stream) == ("m", "/v1/completions", True)
    assert (req.prompt_tokens, req.max_tokens) == (10, 7)
    assert doc is not None and doc["model"] == "m"


def test_no_body_means_no_model() -> None:
    req, doc = parse_request("rid", {":path": "/v1/models"}, None)
    assert req.model is None and doc is None and req.path == "/v1/models"


@pytest.mark.parametrize(
    ("body", "code", "fragment"),
    [
        (b"", "empty_body", "empty"),
        (b"{not json", "invalid_json", "not valid JSON"),
        (b"[1, 2]", "invalid_body", "got an array"),
        (b'"text"', "invalid_body", "got a string"),
        (b'{"prompt": "x"}', "missing_model", "no 'model'"),
        (b'{"model": 3}', "invalid_model", "got a number"),
        (b'{"model": ""}', "invalid_model", "non-empty string"),
        (b'{"model": null}', "missing_model", "no 'model'"),
    ],
)
def test_bad_bodies_say_what_is_wrong(body: bytes, code: str, fragment: str) -> None:
    with pytest.raises(BadRequestError) as info:
        parse_request("rid", HEADERS, body)
    assert info.value.status == 400
    assert info.value.code == code
    assert fragment in info.value.message


def test_prompt_text_for_every_prompt_form() -> None:
    assert parse_prompt({"prompt": "hello"}) == ("hello", None)
    assert parse_prompt({"prompt": ["ab", "cde"]}) == ("abcde", None)
    assert parse_prompt({"prompt": [1, 2, 30000]}) == ("000100020000", 3)  # ids: counted
    chat = {
        "messages": [
            {"role": "system", "content": "abc"},
            {"role": "user", "content": [{"type": "text", "text": "defg"}]},
            "garbage",
        ]
    }
    assert parse_prompt(chat) == ("system: abc\nuser: defg\n", None)
    assert parse_prompt({"model": "m"}) == ("", None)


def test_max_completion_tokens_wins_and_bad_limits_are_ignored() -> None:
    body = orjson.dumps({"model": "m", "max_tokens": 5, "max_completion_tokens": 9})
    assert parse_request("r", HEADERS, body)[0].max_tokens == 9
    body = orjson.dumps({"model": "m", "max_tokens": True})
    assert parse_request("r", HEADERS, body)[0].max_tokens is None
