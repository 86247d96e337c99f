"""The request APIs the EPP reads, one module each, and the registry from a request's
path to its :class:`~epp.common.apis.base.Api` (pure).

=================================  ==========================  =========================
path                               module                      llm-d Router's parser
=================================  ==========================  =========================
``/v1/completions``,               :mod:`.openai`              ``openai-parser``
``/v1/chat/completions``, any
path not below
``/v1/responses``                  :mod:`.openai`              ``openai-parser``
``/v1/embeddings``                 :mod:`.openai`              ``openai-parser``
``/v1/messages``,                  :mod:`.anthropic`           ``anthropic-parser``
``/v1/messages/count_tokens``
``/inference/v1/generate``         :mod:`.generate` (vLLM)     ``vllmhttp-parser``
``/generate``                      :mod:`.generate` (SGLang)   ``sglanghttp-parser``
=================================  ==========================  =========================

The path is looked up once per request (a dict lookup, query string off); what each
API reads, and what it does not: docs/apis.md.
"""

from __future__ import annotations

from epp.common.apis import anthropic, generate, openai
from epp.common.apis.base import Api, Read

__all__ = ["API_BY_PATH", "DEFAULT", "Api", "Read", "api_for"]

# completions, chat, and any path without an API of its own
DEFAULT = openai.OPENAI

API_BY_PATH: dict[str, Api] = {
    "/v1/completions": openai.OPENAI,
    "/v1/chat/completions": openai.OPENAI,
    "/v1/responses": openai.RESPONSES,
    "/v1/embeddings": openai.EMBEDDINGS,
    anthropic.MESSAGES: anthropic.MESSAGES_API,
    anthropic.COUNT_TOKENS: anthropic.COUNT_TOKENS_API,
    generate.VLLM_GENERATE: generate.VLLM,
    generate.SGLANG_GENERATE: generate.SGLANG,
}


def api_for(path: str) -> Api:
    """The API of a request to ``path`` (``:path``, query string included or not);
    OpenAI's for a path without one of its own."""
    api = API_BY_PATH.get(path)
    if api is None:  # a query string, or a path without an API of its own
        api = API_BY_PATH.get(path.split("?", 1)[0], DEFAULT)
    return api
