"""Small helpers around accelerate / torch.distributed that several train/ modules share."""

from __future__ import annotations

from typing import Any


def check_launch(accelerator: Any = None) -> None:
    """Refuse a launch whose strategy accelerate did not set up, and DeepSpeed, before any work: call it
    before the Accelerator is built (`accelerator` None: DeepSpeed, which accelerate would import or
    set up there) and after (FSDP asked for but not given).

    `accelerate launch` with an FSDP or DeepSpeed config tells the processes through
    ACCELERATE_USE_FSDP / ACCELERATE_USE_DEEPSPEED; accelerate 1.15 then selects FSDP only on GPUs and
    other accelerators, so on CPU processes the run would train plain DDP with no word (its
    processes.json saying MULTI_CPU). DeepSpeed was never run with this trainer (docs/distributed.md:
    what was tried, and why it failed): it is refused wherever it is asked for. The main process says
    why on one line; the others stop with the same exit status, silently."""
    import os

    from t2i_gcpo.errors import UserError

    def asked(name: str) -> bool:
        return os.environ.get(name, "false").lower() == "true"

    problem = None
    if accelerator is None:
        main = int(os.environ.get("RANK", "0")) == 0  # set by the launcher in every process
        if asked("ACCELERATE_USE_DEEPSPEED"):
            problem = (
                "DeepSpeed launches are not supported (never run with this trainer, see "
                "docs/distributed.md): launch with configs/accelerate/ddp.yaml or "
                "configs/accelerate/fsdp.yaml"
            )
    else:
        from accelerate.utils import DistributedType

        main, given = accelerator.is_main_process, accelerator.distributed_type
        if asked("ACCELERATE_USE_FSDP") and given != DistributedType.FSDP:
            problem = (
                f"the launch asked for FSDP but accelerate set up {given.value} (it selects FSDP only "
                f"on GPUs and other accelerators, not on CPU processes); for data parallel on CPU launch "
                f"with --multi_gpu"
            )
        elif given == DistributedType.DEEPSPEED:
            problem = "DeepSpeed is not supported (never run with this trainer, see docs/distributed.md)"
    if problem is None:
        return
    if not main:
        raise SystemExit(2)
    raise UserError(problem)


def unwrap(model: Any) -> Any:
    """The adapter inside a DDP / accelerate wrapper (or the model itself). FSDP2 shards a module in
    place, so an FSDP2 model is its own adapter; its weights are whole only after `gather_params`."""
    if is_fsdp2(model):
        return model
    return getattr(model, "module", model)


def is_fsdp2(model: Any) -> bool:
    """Whether `model` was sharded by FSDP2 (`fully_shard`, accelerate's `fsdp_version: 2`)."""
    try:
        from torch.distributed.fsdp import FSDPModule
    except ImportError:  # a torch built without distributed support
        return False
    return isinstance(model, FSDPModule)


def gather_params(model: Any) -> None:
    """FSDP2: all-gather the weights of every shard group and leave them whole, so that code outside
    the root module's forward (KV-cache sampling, decoding, token features, credit maps drawn by the
    main process alone) sees whole weights. The next backward shards them again (FSDP2 reshards
    after backward); the trainer turns resharding after forward off, so forwards in between never
    gather again, and processes that sample different numbers of tokens or batches stay in step.
    A collective when the weights are sharded: every process must call it at the same point. A no-op
    without FSDP2 or when the weights are already whole."""
    if not is_fsdp2(model):
        return
    from torch.distributed.fsdp import FSDPModule

    # FSDP2 takes the first module whose forward runs for its root; sampling may call an inner
    # (sharded) layer first, so name the root now (private API, torch 2.6 – 2.15)
    model._get_fsdp_state()._lazy_init()
    for module in model.modules():  # the same order on every process
        if isinstance(module, FSDPModule):
            module.unshard()


def _reshard(model: Any) -> None:
    """FSDP2: register the shards again on every module (local: frees the gathered copies)."""
    from torch.distributed.fsdp import FSDPModule

    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.reshard()


def full_state_dict(model: Any, everywhere: bool = False) -> dict[str, Any]:
    """The whole model's state dict. FSDP2: gathered from the shards (a collective: every process
    calls it); with `everywhere` False only the main process gets the tensors (on the CPU), the
    others an empty dict. FSDP2 reshards the weights for a state dict: they are gathered again
    (`gather_params`) before returning. Without FSDP2: the plain module's state dict."""
    if not is_fsdp2(model):
        return unwrap(model).state_dict()
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    state = get_model_state_dict(
        model, options=StateDictOptions(full_state_dict=True, cpu_offload=not everywhere)
    )
    gather_params(model)
    return state


def full_optimizer_state_dict(model: Any, optimizer: Any) -> dict[str, Any]:
    """FSDP2: the optimizer state gathered from the shards, keyed by parameter name (a collective;
    the main process gets it on the CPU, the others an empty dict). Without FSDP2: `state_dict()`."""
    if not is_fsdp2(model):
        return optimizer.state_dict()
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

    _reshard(model)  # the optimizer holds the shards: name them while the module holds them too
    state = get_optimizer_state_dict(
        model, optimizer, options=StateDictOptions(full_state_dict=True, cpu_offload=True)
    )
    gather_params(model)
    return state


def load_full_optimizer_state_dict(model: Any, optimizer: Any, state: dict[str, Any]) -> None:
    """FSDP2: shard a `full_optimizer_state_dict` (every process passes the whole one) into the optimizer.
    A state saved without FSDP (`optimizer.state_dict()`: parameters by position) is renamed first: the
    trainer's optimizer holds the trainable parameters in `named_parameters` order."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    _reshard(model)
    groups = state.get("param_groups", [])
    if any(isinstance(i, int) for g in groups for i in g["params"]):
        names = [name for name, p in model.named_parameters() if p.requires_grad]
        if sum(len(g["params"]) for g in groups) != len(names):
            raise ValueError(f"{len(names)} trainable parameters, the state has another number")
        state = {
            "state": {names[i]: v for i, v in state["state"].items()},
            "param_groups": [{**g, "params": [names[i] for i in g["params"]]} for g in groups],
        }
    set_optimizer_state_dict(model, optimizer, state, options=StateDictOptions(full_state_dict=True))
    gather_params(model)


def param_checksum(model: Any) -> Any:
    """Σ of every parameter (float64) of the whole model; FSDP2 shards are gathered first (a
    collective). DDP replicas, and FSDP2 processes, must all report the same number."""
    import torch

    total = torch.zeros((), dtype=torch.float64)
    for p in unwrap(model).parameters():
        p = p.full_tensor() if hasattr(p, "full_tensor") else p  # FSDP2: DTensor shard → whole
        total += p.detach().double().sum().cpu()
    return total


def global_denominator(local: Any, accelerator: Any, active: bool = True) -> Any:
    """The loss normaliser each data-parallel process divides by so that DDP's gradient average equals
    the gradient of one loss over the whole global batch: (Σ_p D_p) / n, D_p the local batch's
    normaliser (`core.losses.aggregation_denominator`: token count, sequence count, Σ m·w …), n
    processes. Each process's loss is then Σ_local / (Σ_p D_p / n); DDP averages the n gradients, which
    gives ∇ Σ_global / Σ_p D_p. With per-process normalisers instead, DDP would average n ratios,
    which is not the ratio of the sums whenever the processes' D_p differ (variable-length text, or a
    process training on fewer groups). `active` False: a process without data (it joins the
    all-reduce with a zero loss) adds 0 to the sum. One all-reduce; every process must call it."""
    import torch

    n = accelerator.num_processes
    if n == 1:
        return local
    d = torch.as_tensor(local, dtype=torch.float64, device=accelerator.device).reshape(1)
    d = accelerator.reduce(d if active else torch.zeros_like(d), reduction="sum")
    return (d / n).reshape(()).to(torch.as_tensor(local).dtype)


def any_process(flag: bool, accelerator: Any) -> bool:
    """Whether `flag` holds on any process (one all-reduce; every process must call it)."""
    import torch

    t = torch.tensor([float(flag)], device=accelerator.device)  # NCCL reduces GPU tensors only
    if accelerator.num_processes > 1:
        torch.distributed.all_reduce(t)
    return bool(t.item() > 0)


def gather_objects(obj: Any, accelerator: Any) -> list[Any]:
    """Every process's `obj`, in process order (a collective under several processes)."""
    if accelerator.num_processes == 1:
        return [obj]
    from accelerate.utils import gather_object

    return gather_object([obj])


def broadcast_from_main(obj: Any, accelerator: Any) -> Any:
    """The main process's `obj`, on every process (a collective under several processes)."""
    if accelerator.num_processes == 1:
        return obj
    from accelerate.utils import broadcast_object_list

    return broadcast_object_list([obj])[0]


def average_over_processes(row: dict[str, float], accelerator: Any) -> dict[str, float]:
    """Average per-process metrics, each key over the processes that report it (their prompt tags
    can differ: `strict/<tag>` exists only where the tag was drawn). Unweighted: exact for means over
    equal shares (reward/mean without dynamic sampling), approximate otherwise."""
    if accelerator.num_processes == 1:
        return row
    rows = gather_objects({k: float(v) for k, v in row.items()}, accelerator)  # one dict per process
    keys = sorted(set().union(*rows))
    return {k: sum(r[k] for r in rows if k in r) / sum(k in r for r in rows) for k in keys}


def leave_process_group() -> None:
    """Destroy the distributed process group, if there is one, before the process exits: a process
    that exits with a live gloo group can abort in C++ teardown ("terminate called without an active
    exception"). Call it once per process, after the last run, when every rank got there."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
