"""Stands in for SGLang 0.5.17's weight-update endpoints where SGLang cannot run (no CUDA), restating
what the server does with each request (read from its source: ``http_server.py``, ``io_struct.py``,
``weight_updater.py``, ``tensor_bucket.py``, ``utils/common.py``):

- ``/release_memory_occupation`` and ``/resume_memory_occupation`` with ``tags`` (a resumed tag must have
  been released; ``None`` means all of weights, KV cache, CUDA graphs);
- ``/update_weights_from_tensor``: ``serialized_named_tensors[tp_rank]`` base64-decoded and unpickled
  under SGLang's module allowlist, ``load_format: flattened_bucket`` rebuilt into named tensors; refused
  while the weights' memory is released;
- ``/init_weights_update_group`` (a TCP rendezvous as rank ``rank_offset`` of a group whose store keys
  are prefixed by ``group_name``) and ``/update_weights_from_distributed`` (a broadcast from rank 0 of
  one flattened byte tensor, rebuilt by names, dtypes and shapes), over gloo instead of NCCL; both load
  the tensors they name and keep the rest (a sync sends buckets); each is recorded with its names,
  weight version and ``flush_cache``;
- ``/update_weights_from_disk``: every ``*.safetensors`` file of ``model_path`` loaded (an error answer when
  there is none), with ``/pause_generation`` and ``/continue_generation`` around it (nothing to pause);
- ``/weights_checker`` (``checksum``): each tensor's checksum under SGLang's own names, which fuse a layer's
  ``q_proj``, ``k_proj`` and ``v_proj`` into ``qkv_proj`` and ``gate_proj`` and ``up_proj`` into
  ``gate_up_proj`` (rows in that order: its ``stacked_params_mapping``), one rank of tensor-parallel size 1
  (the checksum is rlsdk's restatement of SGLang's, held to SGLang's own values in test_weight_checksums.py);
- ``/server_info`` (``tp_size`` 1), ``/model_info`` (the weight version), ``/flush_cache``; ``GET /loaded`` answers what it holds: per weight
  its dtype, shape and sum, the calls in order and the weight version.

``python fake_sglang_weights_server.py PORT AUTHKEY_HEX``: the key lets it fetch CPU tensors shared by
file descriptor from the test process (CUDA tensors travel as IPC handles instead).
"""

import asyncio
import base64
import io
import multiprocessing
import pickle
import sys
from pathlib import Path

import torch
from aiohttp import web

from rlsdk.engines.tensor_transport import join_broadcast_group

ALLOWED = (
    "builtins.",
    "collections.",
    "copyreg.",
    "functools.",
    "itertools.",
    "operator.",
    "types.",
    "weakref.",
    "torch.",
    "multiprocessing.resource_sharer.",
    "multiprocessing.reduction.",
    "pickletools.",
    "sglang.srt.weight_sync.tensor_bucket.",
)
ALL_TAGS = {"weights", "kv_cache", "cuda_graph"}


class Allowlist(pickle.Unpickler):
    def find_class(self, module, name):
        if not (module + ".").startswith(ALLOWED):
            raise RuntimeError(f"Blocked unsafe class loading ({module}.{name})")
        return super().find_class(module, name)


class State:
    def __init__(self):
        self.released = set()
        self.weights = {}
        self.calls = []
        self.version = "default"
        self.groups = {}
        self.updates = []


def rebuild(flat, metadata):
    return {m.name: flat[m.start_idx : m.end_idx].view(m.dtype).reshape(m.shape) for m in metadata}


STACKED = (("qkv_proj", ("q_proj", "k_proj", "v_proj")), ("gate_up_proj", ("gate_proj", "up_proj")))


def as_sglang_holds(weights):
    """SGLang's parameters for these Hugging Face tensors: stacked ones concatenated along rows."""
    held = dict(weights)
    for fused, parts in STACKED:
        for name in [n for n in weights if f".{parts[0]}." in n]:
            names = [name.replace(f".{parts[0]}.", f".{part}.") for part in parts]
            if all(n in held for n in names):
                held[name.replace(f".{parts[0]}.", f".{fused}.")] = torch.cat([held.pop(n) for n in names])
    return held


def make_app(state):
    async def tags_call(request, name):
        body = await request.json()
        tags = set(body.get("tags") or ALL_TAGS)
        if name == "resume" and not tags <= state.released:
            return web.json_response(
                {"error": f"resume of {sorted(tags - state.released)}: not released"}, status=400
            )
        state.released = state.released | tags if name == "release" else state.released - tags
        state.calls.append(f"{name}:{','.join(sorted(tags))}")
        return web.json_response({})

    async def release(request):
        return await tags_call(request, "release")

    async def resume(request):
        return await tags_call(request, "resume")

    async def from_tensor(request):
        body = await request.json()
        state.calls.append("update_weights_from_tensor")
        if "weights" in state.released:
            return web.json_response({"success": False, "message": "weights released"}, status=400)
        payload = Allowlist(io.BytesIO(base64.b64decode(body["serialized_named_tensors"][0]))).load()
        assert body["load_format"] == "flattened_bucket", body["load_format"]
        update = rebuild(payload["flattened_tensor"], payload["metadata"])
        state.weights.update({k: v.clone() for k, v in update.items()})  # a bucket: the named weights only
        state.updates.append([list(update), body.get("weight_version"), body["flush_cache"]])
        state.version = body.get("weight_version") or state.version
        return web.json_response({"success": True, "message": "Success"})

    async def init_group(request):
        body = await request.json()
        state.calls.append("init_weights_update_group")
        state.groups[body["group_name"]] = await asyncio.to_thread(
            join_broadcast_group,  # SGLang's side of the group (its init_custom_process_group), on gloo
            body["master_address"],
            body["master_port"],
            body["rank_offset"],
            body["world_size"],
            body["group_name"],
            "gloo",
            60,
        )
        return web.json_response({"success": True, "message": "ok"})

    async def from_distributed(request):
        body = await request.json()
        state.calls.append("update_weights_from_distributed")
        assert body["load_format"] == "flattened_bucket", body["load_format"]
        parts, metadata, start = [], [], 0
        for name, dtype, shape in zip(body["names"], body["dtypes"], body["shapes"], strict=True):
            empty = torch.empty(shape, dtype=getattr(torch, dtype)).flatten().view(torch.uint8)
            parts.append(empty)
            metadata.append(
                type(
                    "Meta",
                    (),
                    {
                        "name": name,
                        "dtype": getattr(torch, dtype),
                        "shape": shape,
                        "start_idx": start,
                        "end_idx": start + empty.numel(),
                    },
                )
            )
            start += empty.numel()
        flat = torch.cat(parts)
        group = state.groups[body["group_name"]]
        await asyncio.to_thread(torch.distributed.broadcast, flat, 0, group)
        state.weights.update(rebuild(flat, metadata))  # a bucket: the named weights only
        state.updates.append([body["names"], body.get("weight_version"), body["flush_cache"]])
        state.version = body.get("weight_version") or state.version
        return web.json_response({"success": True, "message": "ok"})

    async def from_disk(request):
        from safetensors.torch import load_file

        body = await request.json()
        state.calls.append("update_weights_from_disk")
        files = sorted(Path(body["model_path"]).glob("*.safetensors"))
        if not files:
            message = f"no safetensors weights in {body['model_path']}"
            return web.json_response({"success": False, "message": message}, status=400)
        state.weights = {}
        for file in files:
            state.weights.update(load_file(str(file)))
        state.version = body.get("weight_version") or state.version
        return web.json_response({"success": True, "message": "Succeeded to update model weights."})

    async def loaded(request):
        return web.json_response(
            {
                "weights": {
                    k: [str(v.dtype), list(v.shape), float(v.float().sum())] for k, v in state.weights.items()
                },
                "calls": state.calls,
                "updates": state.updates,
                "weight_version": state.version,
            }
        )

    async def weights_checker(request):
        from rlsdk.engine_api import tensor_checksum

        body = await request.json()
        if body.get("action", "checksum") != "checksum":
            return web.json_response({"success": False, "message": "only checksum here"}, status=400)
        checksums = {name: tensor_checksum(t) for name, t in as_sglang_holds(state.weights).items()}
        info = dict.fromkeys(("tp_rank", "dp_rank", "pp_rank", "rank"), 0)
        info |= dict.fromkeys(("tp_size", "dp_size", "pp_size", "size"), 1)
        rank = {"checksums": checksums, "per_gpu_checksum": "-", "parallelism_info": info}
        return web.json_response({"success": True, "message": "", "ranks": [rank], "per_engine_checksum": "-"})

    async def server_info(request):
        return web.json_response({"tp_size": 1})

    async def model_info(request):  # SGLang 0.5.17 reports the served weights' version here
        return web.json_response({"weight_version": state.version})

    async def ok(request):
        return web.json_response({})

    app = web.Application(client_max_size=1 << 30)
    app.router.add_post("/release_memory_occupation", release)
    app.router.add_post("/resume_memory_occupation", resume)
    app.router.add_post("/update_weights_from_tensor", from_tensor)
    app.router.add_post("/init_weights_update_group", init_group)
    app.router.add_post("/update_weights_from_distributed", from_distributed)
    app.router.add_post("/update_weights_from_disk", from_disk)
    app.router.add_post("/pause_generation", ok)
    app.router.add_post("/continue_generation", ok)
    app.router.add_get("/loaded", loaded)
    app.router.add_post("/weights_checker", weights_checker)
    app.router.add_get("/server_info", server_info)
    app.router.add_get("/model_info", model_info)
    app.router.add_get("/flush_cache", ok)
    app.router.add_get("/health", ok)
    return app


if __name__ == "__main__":
    multiprocessing.current_process().authkey = bytes.fromhex(sys.argv[2])
    web.run_app(make_app(State()), host="127.0.0.1", port=int(sys.argv[1]), print=None)
