"""The OpenAI-compatible endpoint's sessions on the embedded engine (SmolLM2-135M-Instruct, CPU):

- **false forks**: many multi-turn sessions of an agent that never edits its history (it sends back every
  answer as the client returned it, with random tool outputs or user replies in between), sampled at
  temperature 1. Every fork is false; the target is none. ``retokenise_mismatch_sessions`` counts the
  sessions whose transcript, re-tokenised through the chat template, gives other ids than the model sampled:
  the sessions a cache keyed on re-tokenised text would have forked.
- **turn latency**: one turn through ``/sessions/<id>/v1/chat/completions`` against the same turn through
  ``/generate`` (the same prompt ids, greedy, the same number of new tokens), alternating, over loopback
  HTTP; ``overhead`` is the chat turn's median time over ``/generate``'s, less one (target: at most 0.05), and
  ``added_s_median`` the median of each pair's difference (steadier on a shared machine).

    python benchmarks/agent_sessions.py [--sessions 32] [--turns 4] [--latency-turns 20] [--max-tokens 16]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time

import httpx
from harness import machine

from rlsdk.testing import ServedEngine

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "lookup",
            "description": "Look a word up.",
            "parameters": {"type": "object", "properties": {"word": {"type": "string"}}},
        },
    }
]


def agent_session(client: httpx.Client, url: str, turns: int, max_tokens: int, rng: random.Random) -> str:
    """An agent that never edits history: answers sent back as returned, random observations in between."""
    sid = client.post(f"{url}/sessions").json()["id"]
    messages = [{"role": "user", "content": f"Tell me about the number {rng.randint(1, 999)}."}]
    for _ in range(turns):
        reply = client.post(
            f"{url}/sessions/{sid}/v1/chat/completions",
            json={
                "model": "m",
                "messages": messages,
                "tools": TOOLS,
                "max_tokens": max_tokens,
                "temperature": 1.0,
            },
        ).json()
        message = reply["choices"][0]["message"]
        messages.append(message)
        noise = " ".join(rng.choice(["alpha", "7", "beta", "42", "  gamma", "\n", "x=3"]) for _ in range(6))
        for call in message.get("tool_calls") or []:
            messages.append({"role": "tool", "tool_call_id": call["id"], "content": noise})
        if not message.get("tool_calls"):
            messages.append({"role": "user", "content": f"And {noise}?"})
    return sid


def false_forks(served: ServedEngine, sessions: int, turns: int, max_tokens: int) -> dict:
    chat = served.handle.chat
    rng = random.Random(0)
    forks = mismatched = recorded_turns = 0
    with httpx.Client(timeout=600) as client:
        for _ in range(sessions):
            session = chat.sessions.get(agent_session(client, served.url, turns, max_tokens, rng))
            trajectory = session.trajectory()  # checks that every turn extends the recorded ids
            forks += len(session.forks())
            recorded_turns += len(session.turns)
            transcript = session.turns[-1].path_messages(0)
            text = chat.template.render(transcript, TOOLS, add_generation_prompt=False)
            mismatched += chat.template.encode(text)[: len(trajectory.tokens)] != trajectory.tokens
            chat.sessions.close(session.id)
    return {
        "sessions": sessions,
        "turns": recorded_turns,
        "forks": forks,
        "false_fork_rate": forks / max(recorded_turns - sessions, 1),
        "retokenise_mismatch_sessions": mismatched,
    }


def latency(served: ServedEngine, turns: int, max_tokens: int) -> dict:
    chat = served.handle.chat
    chat_times, generate_times = [], []
    with httpx.Client(timeout=600) as client:
        sid = client.post(f"{served.url}/sessions").json()["id"]
        session = chat.sessions.get(sid)
        messages = [{"role": "user", "content": "Write a long story about a lighthouse keeper."}]
        for i in range(turns):
            body = {"model": "m", "messages": messages, "max_tokens": max_tokens, "temperature": 0}
            started = time.perf_counter()
            reply = client.post(f"{served.url}/sessions/{sid}/v1/chat/completions", json=body).json()
            chat_seconds = time.perf_counter() - started
            turn = session.turns[-1]
            params = {
                "temperature": 0,
                "max_new_tokens": max_tokens,
                "skip_special_tokens": True,
                "no_stop_trim": False,
                "spaces_between_special_tokens": False,
            }
            started = time.perf_counter()
            output = client.post(
                f"{served.url}/generate",
                json={"input_ids": turn.prompt_ids, "sampling_params": params, "return_logprob": True},
            ).json()
            generate_seconds = time.perf_counter() - started
            assert output["output_ids"] == turn.choices[0].output_ids, (
                "the two paths generated different tokens"
            )
            if i:  # the first turn warms both paths up
                chat_times.append(chat_seconds)
                generate_times.append(generate_seconds)
            messages += [reply["choices"][0]["message"], {"role": "user", "content": "Go on."}]
    chat_median, generate_median = statistics.median(chat_times), statistics.median(generate_times)
    overhead = chat_median / generate_median - 1
    added = statistics.median(c - g for c, g in zip(chat_times, generate_times, strict=True))
    return {
        "turns": len(chat_times),
        "new_tokens": max_tokens,
        "chat_s_median": chat_median,
        "generate_s_median": generate_median,
        "added_s_median": added,
        "added_share": added / generate_median,
        "overhead": overhead,
        "target": 0.05,
        "meets_target": overhead <= 0.05,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=32)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--latency-turns", type=int, default=20)
    parser.add_argument("--max-tokens", type=int, default=16)
    options = parser.parse_args()
    from rlsdk_embedded import EmbeddedEngine

    with ServedEngine(EmbeddedEngine(device="cpu", max_batch_size=8)) as served:
        forks = false_forks(served, options.sessions, options.turns, options.max_tokens)
        timing = latency(served, options.latency_turns, options.max_tokens)
    print(
        json.dumps(
            {
                "benchmark": "agent_sessions",
                "machine": machine(),
                "false_forks": forks,
                "latency": timing,
                "meets_target": forks["forks"] == 0 and timing["meets_target"],
            }
        )
    )


if __name__ == "__main__":
    main()
