"""How the simulator counts prompt tokens without KV events, and that rule written as a
Hugging Face tokenizer a benchmark client can load.

The rule: a prompt's text is cut into pieces of 4 characters (Unicode code points) from
its start, the last piece shorter; each piece is a token, so a text of n characters is
ceil(n / 4) tokens. :func:`token_keys` gives the pieces (lossless: the simulator's
per-token keys), :func:`count_tokens` their number.

The tokenizer files (:func:`write_tokenizer_files`) count by the same rule, whatever the
text, and give every id a 4-character text of its own, so any sequence of ids decodes to
a text that counts (and re-encodes to) exactly as many tokens: what a client that builds
prompts from random token ids (inference-perf's ``shared_prefix`` data) needs to hit the
length it asks for. Ids 0 to 65535 are the 4-character strings over :data:`ALPHABET`
(16 characters, the id read as a 4-digit base-16 number, first character most
significant); every other piece, including a last piece shorter than 4, is the one
unknown id :data:`UNKNOWN_ID`, whose text is 4 replacement characters (so it decodes to
4 characters too). The ids are therefore lossy outside the alphabet: they count, they do
not identify text, which is why the simulator's KV-events mode (where token ids key the
cache that both sides index) keeps its byte tokenizer (epp_harness.sim.tokenizer).

Implemented here twice on purpose: :func:`encode` by arithmetic, the files for the
``tokenizers`` library (a ``Split`` pre-tokenizer, a ``WordLevel`` model, a ``Fuse``
decoder), so a test can check one against the other.
"""

from __future__ import annotations

from pathlib import Path

from epp_harness.sim.config import CHARS_PER_TOKEN
from epp_harness.sim.hf_files import write_hf_tokenizer

# space and the 15 most frequent English letters: random ids decode to word-like text
ALPHABET = " etaoinshrdlcumw"
_DIGIT = {char: i for i, char in enumerate(ALPHABET)}
UNKNOWN_ID: int = len(ALPHABET) ** CHARS_PER_TOKEN
UNKNOWN_TEXT = "\ufffd" * CHARS_PER_TOKEN
# a piece: 1 to 4 code points, newlines included
PIECE_PATTERN = f"[\\s\\S]{{1,{CHARS_PER_TOKEN}}}"

# vLLM renders a chat for a model without a template of its own by joining the messages'
# texts; the simulator counts a chat prompt as its messages' text parts joined (protocol)
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['content'] is string %}{{ message['content'] }}"
    "{% elif message['content'] %}{% for part in message['content'] %}"
    "{% if part['type'] == 'text' %}{{ part['text'] }}{% endif %}"
    "{% endfor %}{% endif %}"
    "{% endfor %}"
)


def count_tokens(text: str) -> int:
    """The simulator's token count of ``text``: ceil(characters / 4)."""
    return -(-len(text) // CHARS_PER_TOKEN)


def token_keys(text: str) -> list[str]:
    """The tokens of ``text`` as their own text (4 characters each, the last one
    shorter): one key per token, as many as :func:`count_tokens` says."""
    return [text[i : i + CHARS_PER_TOKEN] for i in range(0, len(text), CHARS_PER_TOKEN)]


def piece_id(piece: str) -> int:
    """A piece's id: its base-16 value over :data:`ALPHABET`, or :data:`UNKNOWN_ID`."""
    if len(piece) != CHARS_PER_TOKEN:
        return UNKNOWN_ID
    value = 0
    for char in piece:
        digit = _DIGIT.get(char)
        if digit is None:
            return UNKNOWN_ID
        value = value * len(ALPHABET) + digit
    return value


def encode(text: str) -> list[int]:
    """The token ids of ``text``, as the written files give them."""
    return [piece_id(piece) for piece in token_keys(text)]


def id_text(token_id: int) -> str:
    """The 4 characters token ``token_id`` decodes to."""
    if not 0 <= token_id < UNKNOWN_ID:
        return UNKNOWN_TEXT
    chars = []
    for _ in range(CHARS_PER_TOKEN):
        token_id, digit = divmod(token_id, len(ALPHABET))
        chars.append(ALPHABET[digit])
    return "".join(reversed(chars))


def write_tokenizer_files(directory: Path) -> Path:
    """Write this tokenizer as ``tokenizer.json`` + ``tokenizer_config.json`` (with a
    chat template that joins the messages' texts, as the simulator counts a chat)."""
    vocab = {id_text(i): i for i in range(UNKNOWN_ID)}
    vocab[UNKNOWN_TEXT] = UNKNOWN_ID
    split = {
        "type": "Split",
        "pattern": {"Regex": PIECE_PATTERN},
        "behavior": "Isolated",
        "invert": False,
    }
    config = {
        "chat_template": CHAT_TEMPLATE,
        "clean_up_tokenization_spaces": False,
        "model_max_length": 1_000_000,
    }
    return write_hf_tokenizer(
        directory,
        pre_tokenizer=split,
        model={"type": "WordLevel", "vocab": vocab, "unk_token": UNKNOWN_TEXT},
        decoder={"type": "Fuse"},
        config=config,
    )
