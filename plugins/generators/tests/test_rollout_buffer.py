"""The rollout buffer service over real HTTP on loopback (``rlsdk buffer serve`` in a subprocess, or
the same server in process where a test registers its own task generator), and the ``rollout_buffer``
rollout that turns collected trajectories into training samples."""

import json
import os
import signal
import subprocess
import sys
import threading
import time

import httpx
import pytest

import rlsdk_filter_hub.plugin
from rlsdk import DataSource, RlsdkError, RolloutConfig, Runtime, Sample, TaskGenerator, hookimpl
from rlsdk.testing import FakeEngine, ServedBuffer, bind_runtime
from rlsdk_generators import plugin as generators_plugin
from rlsdk_generators.chat_mask import conversation_tokens
from rlsdk_generators.rollout_buffer import rollout_buffer

CLI = [sys.executable, "-c", "from rlsdk_cli.app import main; main()", "buffer", "serve", "--port", "0"]


def item(instance, n, reward=1.0, **extra):
    return {
        "instance_id": instance,
        "uid": f"{instance}-{n}",
        "reward": reward,
        "extra_info": extra,
        "messages": [
            {"role": "user", "content": f"Question {instance}?"},
            {"role": "assistant", "content": f"Answer {n}."},
        ],
    }


def start_service(data_dir, *options, env=None):
    proc = subprocess.Popen(
        [*CLI, "--data-dir", str(data_dir), *options],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
    )
    line = proc.stdout.readline()
    assert line.startswith("rollout buffer on "), line + proc.stderr.read()
    return proc, line.split()[3]


def buffer_service(pm, folder):
    """A buffer service keeping its data under ``folder``/buffer, reading inputs from ``folder``."""
    return ServedBuffer(pm, folder / "buffer", service_options={"input_dirs": [folder]}).service


def buffer_run(pm, tokenizer, service, **options):
    """The options of a run reading its groups from ``service``, with its runtime bound (the engine, a
    FakeEngine with ``tokenizer``, generates nothing: the agents do)."""
    args = RolloutConfig(rollout_buffer_url=service.url, **options)
    bind_runtime(args, Runtime(pm, FakeEngine([], tokenizer), tokenizer))
    return args


ECHO = {"n_samples_per_prompt": 2, "input_key": "q", "rollout_task_type": "echo", "rollout_buffer_wait": 30}
"""Groups of two from EchoTask over :func:`questions`."""


def questions(folder, count):
    """``count`` rows ``{"q": "What is i+1?", "a": "i+1"}`` in ``folder``/rows.jsonl."""
    rows = folder / "rows.jsonl"
    rows.write_text(
        "".join(json.dumps({"q": f"What is {i}+1?", "a": str(i + 1)}) + "\n" for i in range(count))
    )
    return rows


def data_source(pm, args, tokenizer):
    """The data source as `rlsdk run --rollout rollout_buffer` builds it (the rollout does not read it:
    agents read ``input_file`` themselves)."""
    pm.register(rlsdk_filter_hub.plugin)
    keep = pm.resolve("generate_rollout", "rollout_buffer").record.chat_messages
    return DataSource(args, pm=pm, tokenizer=tokenizer, keep_messages=keep)


def stop(proc):
    if proc.poll() is None:
        proc.send_signal(signal.SIGKILL)
    proc.wait()


def test_kill_and_restart_loses_no_acknowledged_item(tmp_path):
    proc, url = start_service(tmp_path)
    acked, stop_writing = [], threading.Event()

    def writer(worker):
        with httpx.Client(timeout=5) as client:
            for n in range(200):
                if stop_writing.is_set():
                    return
                body = item(f"g{worker}", n)
                try:
                    if client.post(url + "/buffer/write", json=body).status_code == 200:
                        acked.append(body["uid"])
                except httpx.HTTPError:
                    return  # the service died under us: this write was never acknowledged

    threads = [threading.Thread(target=writer, args=(w,)) for w in range(3)]
    for t in threads:
        t.start()
    while len(acked) < 30:
        time.sleep(0.01)
    proc.send_signal(signal.SIGKILL)  # items in flight while the service dies
    proc.wait()
    stop_writing.set()
    for t in threads:
        t.join()

    proc, url = start_service(tmp_path)
    try:
        # agents retry everything they were not sure of; duplicates by uid are stored once
        for worker in range(3):
            for n in range(12):
                assert httpx.post(url + "/buffer/write", json=item(f"g{worker}", n)).status_code == 200
        data = httpx.post(url + "/get_rollout_data", json={"lease_seconds": 30}).json()
        uids = [i["uid"] for i in data["data"]["data"]]
        assert data["success"] and set(acked) <= set(uids) and len(uids) == len(set(uids))
        assert sorted(data["data"]["meta_info"]["finished_groups"]) == ["g0", "g1", "g2"]
        lease = {"lease_id": data["data"]["meta_info"]["lease_id"]}
        assert httpx.post(url + "/ack_rollout_data", json=lease).json()["acknowledged"] == len(uids)
        # acknowledged groups are not served again after another restart
        stop(proc)
        proc, url = start_service(tmp_path)
        again = httpx.post(url + "/get_rollout_data", json={}).json()
        assert again["success"] is False and again["data"]["data"] == []
    finally:
        stop(proc)


def test_every_item_is_validated_with_a_message(tmp_path):
    proc, url = start_service(tmp_path, "--max-body-mb", "0.01")
    try:

        def write(body):
            return httpx.post(url + "/buffer/write", json=body)

        cases = [
            ([1, 2], "must be a JSON object"),
            ({"messages": [], "reward": 1}, "needs instance_id"),
            ({**item("a", 0), "messages": "hi"}, "messages must be a non-empty list"),
            (
                {**item("a", 0), "messages": [{"content": "x"}]},
                "messages[0] must be an object with a string 'role'",
            ),
            ({**item("a", 0), "messages": [{"role": "user", "content": "x"}]}, "no assistant turn"),
            ({**item("a", 0), "reward": "high"}, "reward must be a number"),
            ({**item("a", 0), "extra_info": [1]}, "extra_info must be an object"),
        ]
        for body, message in cases:
            response = write(body)
            assert response.status_code == 400 and message in response.json()["message"], (
                body,
                response.text,
            )
        not_json = httpx.post(
            url + "/buffer/write", content=b"{oops", headers={"Content-Type": "application/json"}
        )
        assert not_json.status_code == 400 and "not JSON" in not_json.json()["message"]
        big = write({**item("a", 0), "extra_info": {"blob": "x" * 20000}})
        assert big.status_code == 413 and "limit" in big.json()["message"]
        assert httpx.post(url + "/nope", json={}).status_code == 404
        bad_task = httpx.post(url + "/start_rollout", json={"task_type": "nonexistent"})
        assert (
            bad_task.status_code == 400
            and "unknown task_generator 'nonexistent'" in bad_task.json()["message"]
        )
        assert write(item("a", 0)).status_code == 200
    finally:
        stop(proc)


def test_off_loopback_requires_the_token(tmp_path):
    refused = subprocess.run(
        [*CLI, "--host", "0.0.0.0", "--data-dir", str(tmp_path)],
        capture_output=True,
        text=True,
        env={k: v for k, v in os.environ.items() if k != "RLSDK_BUFFER_TOKEN"},
    )
    assert refused.returncode == 2 and "needs a bearer token" in refused.stderr
    assert not any(tmp_path.iterdir())
    proc, url = start_service(tmp_path, "--host", "0.0.0.0", env={"RLSDK_BUFFER_TOKEN": "s3cret-of-sixteen+"})
    try:
        assert httpx.post(url + "/buffer/write", json=item("a", 0)).status_code == 401
        wrong = httpx.post(url + "/get_rollout_data", json={}, headers={"Authorization": "Bearer nope"})
        assert wrong.status_code == 401
        ok = httpx.post(
            url + "/buffer/write", json=item("a", 0), headers={"Authorization": "Bearer s3cret-of-sixteen+"}
        )
        assert ok.status_code == 200
    finally:
        stop(proc)


class EchoTask:
    """A task generator that writes two-sample groups for each row of its input file, with slime's
    optional group hooks."""

    @hookimpl
    def rlsdk_task_generators(self):
        def run_rollout(data):
            rows = [json.loads(line) for line in open(data["input_file"])]
            with httpx.Client() as client:
                for r, row in enumerate(rows):
                    for n in range(int(data["num_repeat_per_sample"])):
                        messages = [
                            {"role": "user", "content": row["q"]},
                            {"role": "assistant", "content": f"{row['a']} (try {n})"},
                        ]
                        body = {
                            "instance_id": r,
                            "uid": f"{r}-{n}",
                            "messages": messages,
                            "reward": float(n),
                            "extra_info": {"finish_reason": "length" if n else "stop"},
                        }
                        client.post(data["remote_buffer_url"] + "/buffer/write", json=body).raise_for_status()

        def transform_group(group, task_type):
            instance_id, items = group
            return instance_id, [{**i, "extra_info": {**i["extra_info"], "task": task_type}} for i in items]

        def meta_info(groups):
            return {"seen": sum(len(v) for v in groups.values())}

        yield TaskGenerator(
            name="echo", func=run_rollout, transform_group=transform_group, get_group_data_meta_info=meta_info
        )


def test_rollout_buffer_rollout_turns_trajectories_into_samples(rlsdk_pm, small_tokenizer, tmp_path):
    rlsdk_pm.register(generators_plugin)
    rlsdk_pm.register(EchoTask())
    service = buffer_service(rlsdk_pm, tmp_path)
    rows = questions(tmp_path, 4)
    with ServedBuffer(service):
        args = buffer_run(
            rlsdk_pm, small_tokenizer, service, rollout_batch_size=2, prompt_data=str(rows), **ECHO
        )
        source = data_source(rlsdk_pm, args, small_tokenizer)
        first = rollout_buffer(args, 0, source)
        second = rollout_buffer(args, 1, source)
    assert [len(g) for g in first.samples] == [2, 2] and [len(g) for g in second.samples] == [2, 2]
    assert first.metrics["rollout/buffer/groups"] == 2
    # the step table's kept column and reward (they showed "-" with 4 samples kept)
    assert first.metrics["ledger/kept"] == first.metrics["ledger/entered"] == 4
    rewards = [s.reward for g in first.samples for s in g]
    assert first.metrics["rollout/reward_mean"] == sum(rewards) / 4 and 0 < sum(rewards) < 4
    sample = first.samples[0][1]
    ids, mask = conversation_tokens(small_tokenizer, sample.prompt)
    assert sample.tokens == ids and sample.loss_mask == mask[len(ids) - sample.response_length :]
    assert (
        small_tokenizer.decode(ids[len(ids) - sample.response_length :])
        == f"{sample.prompt[1]['content']}<|im_end|>\n"
    )
    assert sample.reward == 1.0 and sample.status == Sample.Status.TRUNCATED
    assert first.samples[0][0].status == Sample.Status.COMPLETED
    assert sample.metadata["task"] == "echo" and sample.metadata["uid"] == "0-1"
    assert service.store.task["task_type"] == "echo"


def test_rollout_buffer_reports_a_failing_task(rlsdk_pm, small_tokenizer, tmp_path):
    class Broken:
        @hookimpl
        def rlsdk_task_generators(self):
            def run_rollout(data):
                raise FileNotFoundError(data["input_file"])

            yield TaskGenerator(name="broken", func=run_rollout)

    rlsdk_pm.register(Broken())
    rlsdk_pm.register(generators_plugin)
    service = buffer_service(rlsdk_pm, tmp_path)
    chats = tmp_path / "chats.jsonl"
    chats.write_text(json.dumps({"input": [{"role": "user", "content": "Hi"}]}) + "\n")
    with ServedBuffer(service):
        args = buffer_run(
            rlsdk_pm,
            small_tokenizer,
            service,
            prompt_data=str(chats),
            rollout_task_type="broken",
            rollout_buffer_wait=10,
        )
        source = data_source(rlsdk_pm, args, small_tokenizer)  # chat messages, kept for the agents
        with pytest.raises(
            RuntimeError, match="task_generator 'broken'.*raised FileNotFoundError: .*chats.jsonl"
        ):
            rollout_buffer(args, 0, source)


def test_surplus_groups_stay_in_the_service_across_a_trainer_crash(rlsdk_pm, small_tokenizer, tmp_path):
    """The rollout took every complete group and kept the surplus in its own memory: a trainer that died
    (or resumed) lost them. Now it asks for what it needs, and the rest stays in the service, on disk."""
    rlsdk_pm.register(generators_plugin)
    rlsdk_pm.register(EchoTask())
    rows = questions(tmp_path, 3)
    service = buffer_service(rlsdk_pm, tmp_path)
    with ServedBuffer(service):

        def fresh_trainer():
            return buffer_run(
                rlsdk_pm, small_tokenizer, service, rollout_batch_size=1, prompt_data=str(rows), **ECHO
            )

        args = fresh_trainer()
        source = data_source(rlsdk_pm, args, small_tokenizer)
        first = rollout_buffer(args, 0, source)
        deadline = time.monotonic() + 10
        while service.store.counts()["written"] < 6 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert service.store.counts()["pending_groups"] == 2  # not pulled into the trainer's memory
        args = fresh_trainer()  # the trainer died and came back: its memory is gone
        later = [rollout_buffer(args, step, source) for step in (1, 2)]
    served = [s.metadata["uid"] for out in (first, *later) for group in out.samples for s in group]
    assert sorted(served) == [f"{r}-{n}" for r in range(3) for n in range(2)]


def test_waiting_in_vain_is_an_error_rlsdk_run_reports_in_one_line(rlsdk_pm, small_tokenizer, tmp_path):
    """It used to be a bare TimeoutError, which `rlsdk run` showed as a raw traceback."""

    rlsdk_pm.register(generators_plugin)
    service = buffer_service(rlsdk_pm, tmp_path)
    with ServedBuffer(service):
        args = buffer_run(rlsdk_pm, small_tokenizer, service, rollout_batch_size=1, rollout_buffer_wait=0.2)
        with pytest.raises(RlsdkError, match="0 of 1 complete groups after 0.2s .*are agents writing to it"):
            rollout_buffer(args, 0, None)
