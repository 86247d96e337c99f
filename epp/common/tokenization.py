"""A request's prompt as the engine's token ids, computed in process from the model's own
tokenizer files (no download, no call to the server). docs/kv-events.md says why this
and not the server's ``/tokenize``, and what it costs.

What vLLM does, reproduced here:

* completions: ``prompt`` encoded with ``add_special_tokens`` (the request's field,
  default true: BOS and the like, as the tokenizer's post-processor adds them); a
  prompt of token ids is used as is; of a batch of prompts only the first is matched;
* chat: ``messages`` rendered by the model's chat template (jinja2, in the sandbox and
  with the options Hugging Face's ``apply_chat_template`` uses: ``trim_blocks``,
  ``lstrip_blocks``, ``raise_exception``, ``strftime_now``, a ``tojson`` that keeps
  non-ASCII), with ``add_generation_prompt`` (default true), ``continue_final_message``,
  ``tools``, ``documents`` and ``chat_template_kwargs``, and the tokenizer's special
  tokens (``bos_token`` ...); the text then encoded *without* special tokens (the
  template writes them), unless the request sets ``add_special_tokens``. Content given
  as a list of parts becomes its text parts joined by newlines (vLLM's "string"
  content format).

* Anthropic Messages: turned into the chat request vLLM makes of it
  (:func:`epp.common.apis.anthropic.chat_body`), then as chat;
* vLLM's ``/inference/v1/generate`` and SGLang's ``/generate``: their token ids as
  they are (of an SGLang batch, the first).

Anything else (a request-supplied ``chat_template``, images, a template that raises)
gives None: the scorer then falls back to the approximate index for that request.
"""

from __future__ import annotations

import json
from array import array
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from epp.common.apis.anthropic import MESSAGES, chat_body
from epp.common.apis.generate import SGLANG_GENERATE, VLLM_GENERATE
from epp.errors import InternalError

if TYPE_CHECKING:
    import jinja2

COMPLETIONS = "/v1/completions"
CHAT = "/v1/chat/completions"
_SPECIAL = (
    "bos_token",
    "eos_token",
    "unk_token",
    "sep_token",
    "pad_token",
    "cls_token",
    "mask_token",
)


class TokenizerError(InternalError, ValueError):
    """The tokenizer files cannot be used (the message names the file and why)."""


class PromptTokenizer(Protocol):
    """Text to the engine's token ids. Contract: synchronous, no I/O (files are read
    when it is made); returns None when it cannot say exactly what the engine would."""

    def encode(self, text: str, add_special_tokens: bool) -> list[int] | None: ...

    def render_chat(self, body: Mapping[str, Any]) -> str | None: ...


def prompt_token_ids(
    path: str, body: Mapping[str, Any] | None, tokenizer: PromptTokenizer | None
) -> list[int] | None:
    """The token ids the engine will see for this request, or None if unknown."""
    if body is None:
        return None
    if path == COMPLETIONS:
        prompt = body.get("prompt")
        if isinstance(prompt, list) and prompt:
            prompt = prompt[0] if not _is_id(prompt[0]) else prompt
        if isinstance(prompt, list):
            return _ids(prompt)
        if isinstance(prompt, str) and tokenizer is not None:
            special = body.get("add_special_tokens", True)
            return tokenizer.encode(prompt, special is not False)
        return None
    if path == CHAT and tokenizer is not None:
        return _chat_ids(body, tokenizer)
    if path == MESSAGES and tokenizer is not None:
        chat = chat_body(body)  # the chat request vLLM makes of it
        return None if chat is None else _chat_ids(chat, tokenizer)
    if path == VLLM_GENERATE:
        return _ids(body.get("token_ids") or [])
    if path == SGLANG_GENERATE:
        ids = body.get("input_ids")
        if isinstance(ids, list) and ids and isinstance(ids[0], list):
            ids = ids[0]  # of a batch, the first is matched (as completions)
        return _ids(ids) if isinstance(ids, list) else None
    return None


def _chat_ids(body: Mapping[str, Any], tokenizer: PromptTokenizer) -> list[int] | None:
    text = tokenizer.render_chat(body)
    if text is None:
        return None
    return tokenizer.encode(text, body.get("add_special_tokens") is True)


class HfTokenizer:
    """A model's ``tokenizer.json`` with its chat template (``chat_template.jinja``, else
    ``chat_template`` in ``tokenizer_config.json``) and special tokens, from a local
    directory. Raises :class:`TokenizerError` when the directory cannot be used."""

    def __init__(self, directory: Path) -> None:
        # imported here: only a config with a precise prefix scorer loads a tokenizer, and
        # every `epp serve` would pay for these imports otherwise (docs/testing.md)
        import jinja2
        from tokenizers import Tokenizer

        self.directory = directory
        path = directory / "tokenizer.json"
        try:
            self._tokenizer = Tokenizer.from_file(str(path))
        except Exception as exc:  # tokenizers raises plain Exception for every problem
            raise TokenizerError(f"{path}: cannot load: {exc}") from None
        config = _read_json(directory / "tokenizer_config.json")
        self.special_tokens = {
            name: text for name in _SPECIAL if (text := _token_text(config.get(name))) is not None
        }
        env = _environment()
        self._templates: dict[str, jinja2.Template] = {}
        for name, source in _templates(directory, config).items():
            try:
                self._templates[name] = env.from_string(source)
            except jinja2.TemplateSyntaxError as exc:
                raise TokenizerError(f"{directory}: chat template {name!r}: {exc}") from None
        self.failures = 0  # requests the template or the tokenizer refused

    def encode(self, text: str, add_special_tokens: bool) -> list[int] | None:
        try:
            encoding = self._tokenizer.encode(text, add_special_tokens=add_special_tokens)
        except Exception:  # tokenizers raises plain Exception (e.g. unencodable text)
            self.failures += 1
            return None
        ids: list[int] = encoding.ids
        return ids

    def render_chat(self, body: Mapping[str, Any]) -> str | None:
        messages = body.get("messages")
        if not isinstance(messages, list) or "chat_template" in body:
            return None
        tools = body.get("tools")
        template = self._templates.get("tool_use" if tools else "default")
        template = template or self._templates.get("default")
        if template is None:
            return None
        normalized = [m for m in map(_message, messages) if m is not None]
        if len(normalized) != len(messages):
            return None
        kwargs = body.get("chat_template_kwargs")
        continue_final = body.get("continue_final_message") is True
        variables: dict[str, Any] = {
            **self.special_tokens,
            **(kwargs if isinstance(kwargs, dict) else {}),
            "messages": normalized,
            "tools": tools,
            "documents": body.get("documents"),
            "add_generation_prompt": body.get("add_generation_prompt", True) is not False
            and not continue_final,
        }
        try:
            text = template.render(variables)
        except Exception:  # raise_exception(), or any error of the template's own code
            self.failures += 1
            return None
        if continue_final and normalized:
            # end the text where the last message's content ends (no end-of-turn)
            final = str(normalized[-1]["content"]).strip()
            at = text.rfind(final) if final else -1
            if at < 0:
                return None
            text = text[: at + len(final)]
        return text


def _templates(directory: Path, config: Mapping[str, Any]) -> dict[str, str]:
    """Named chat templates: a ``chat_template.jinja`` file is the default one."""
    found: dict[str, str] = {}
    raw = config.get("chat_template")
    if isinstance(raw, str):
        found["default"] = raw
    elif isinstance(raw, list):  # [{"name": ..., "template": ...}]
        for item in raw:
            if isinstance(item, dict) and isinstance(item.get("template"), str):
                found[str(item.get("name", "default"))] = item["template"]
    jinja_file = directory / "chat_template.jinja"
    if jinja_file.is_file():
        found["default"] = jinja_file.read_text()
    return found


def _message(message: Any) -> dict[str, Any] | None:
    if not isinstance(message, dict) or not isinstance(message.get("role"), str):
        return None
    content = message.get("content")
    if isinstance(content, list):
        texts = []
        for part in content:
            if not isinstance(part, dict) or part.get("type") != "text":
                return None  # an image or audio part: placeholders we cannot reproduce
            texts.append(str(part.get("text", "")))
        content = "\n".join(texts)
    elif content is None:
        content = ""
    elif not isinstance(content, str):
        return None
    return {**message, "content": content}


def _raise(message: str) -> None:
    import jinja2

    raise jinja2.TemplateError(message)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | str | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _environment() -> jinja2.Environment:
    import jinja2.ext
    import jinja2.nodes
    import jinja2.parser
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class _GenerationBlock(jinja2.ext.Extension):
        """``{% generation %}...{% endgeneration %}`` (marks assistant text for training
        masks in Hugging Face's renderer): here it only renders its body."""

        tags = {"generation"}

        def parse(self, parser: jinja2.parser.Parser) -> jinja2.nodes.Node:
            lineno = next(parser.stream).lineno
            body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
            return jinja2.nodes.Scope(body, lineno=lineno)

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=[jinja2.ext.loopcontrols, _GenerationBlock],
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise
    # the engine renders templates with the wall-clock date too (some templates print it)
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise TokenizerError(f"{path}: cannot read: {exc}") from None
    return doc if isinstance(doc, dict) else {}


def _token_text(value: Any) -> str | None:
    """A special token as tokenizer_config.json writes it: a string or an AddedToken."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict) and isinstance(value.get("content"), str):
        content: str = value["content"]
        return content
    return None


def _ids(values: list[Any]) -> list[int] | None:
    """``values`` when it is a non-empty list of integers (checked in C: a prompt may
    hold many thousands)."""
    if not values:
        return None
    try:
        array("q", values)
    except (TypeError, OverflowError):
        return None
    return values


def _is_id(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0
