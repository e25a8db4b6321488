"""Per-device memory estimate for every role of a composed config, before anything is loaded.

The model is a phase model of the hybrid engine: on one device the roles take turns (rollout -> reference
log-probs -> critic -> actor update), so each role's peak is its own working set plus whatever the OTHER roles
keep resident between their turns (weights and optimizer state unless offloaded) plus one runtime per process on
the device. The terms, per device (N = FSDP shard group size, P = parameters, T = tokens per micro-batch):

- FSDP2 training state: fp32 master weights, fp32 gradients and AdamW's two fp32 moments, all / N (rlcore keeps
  fp32 masters whatever fsdp_config.model_dtype says). A frozen role (the reference) and a LoRA run's frozen base
  are stored in model_dtype / N; with LoRA only the adapters carry gradients and optimizer state. offload_policy moves the state to CPU.
- gathered weights in the compute dtype: the root unit (embeddings, head) plus two blocks (one prefetched) with
  reshard_after_forward=True (ZeRO-3), all of them with False (ZeRO-2-like: kept from forward to backward).
- activations: with gradient checkpointing every block keeps its input (T x hidden) and one block is recomputed
  at a time; without it every block keeps its full set (~6 hidden + 2 KV + 4 intermediate values per token).
  Attention is flash/SDPA (no T^2 term). Logits: rlcore never materialises `[response tokens, vocab]`; its head
  projects one chunk of at most LOGITS_CHUNK_BYTES of float32 logits at a time (rlcore.models.logits), and holds
  the chunk's logits, softmax and (in backward) their gradient in float32 plus one compute-dtype copy.
- rollout (vLLM): exactly gpu_memory_utilization x device memory; inside it weights / TP, a profiling and CUDA
  graph reserve, and the KV cache, which gives the number of full-length sequences decoded at once. The native
  engine holds its own weight copy and a KV cache for all of a rank's samples.
- runtime per process: CUDA context + NCCL + allocator slack (1 GiB), or the Python/torch/Ray worker on CPU (0.4 GiB).

Verdicts: fits (<= 90% of the device), tight (the last 10%: fragmentation can tip it over), OOM (> 100%).
Each role names the largest lever with its estimated saving. Imports neither torch nor ray.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Optional

from omegaconf import DictConfig, OmegaConf

from rlcore.config.fsdp_schema import compute_dtype, role_sp
from rlcore.config.lora_schema import adapter_rank
from rlcore.config.reward_model_schema import uses_token_budgets
from rlcore.plan.arch import Arch, resolve_arch
from rlcore.plan.heads import head_errors
from rlcore.plan.megatron_layout import Layout
from rlcore.plan.placement import placement
from rlcore.plan.rollout_memory import rollout_memory
from rlcore.plan.teacher_memory import teacher_phases
from rlcore.plan.tower_memory import tower_activations
from rlcore.rollout.sizing import rollout_sizing
from rlcore.utils.sizes import DTYPE_BYTES, LOGITS_CHUNK_BYTES

GIB = 2 ** 30
ARR = "actor_rollout_ref"
RUNTIME_GIB = {"cuda": 1.0, "cpu": 0.4}
FIT, TIGHT = 0.90, 1.00
_BYTES = DTYPE_BYTES


def runtime_gib(device: str) -> float:
    """The runtime's share of a device; an unsupported device (validation refuses it, naming the fix) is planned as
    CUDA, so the doctor still reports the rest."""
    return RUNTIME_GIB.get(device, RUNTIME_GIB["cuda"])


@dataclass
class RoleMemory:
    role: str  # e.g. "actor update"
    where: str  # the devices and what shares them
    items: list[tuple[str, float]] = field(default_factory=list)  # (what, GiB) on one device at this role's peak
    capacity: float = 0.0  # GiB per device
    note: str = ""  # e.g. the rollout's concurrent sequences
    levers: list[tuple[str, float]] = field(default_factory=list)  # (setting, GiB saved), largest first

    @property
    def peak(self) -> float:
        return sum(gib for _, gib in self.items)

    @property
    def verdict(self) -> str:
        if self.peak > TIGHT * self.capacity or self.note.startswith("OOM"):
            return "OOM"
        return "tight" if self.peak > FIT * self.capacity else "fits"


@dataclass
class MemoryPlan:
    capacity: float  # GiB per device
    capacity_source: str
    arch_notes: list[str]  # where each model's shapes came from
    roles: list[RoleMemory]
    errors: list[str]  # rules that need the architecture (max lengths vs positions)

    @property
    def ok(self) -> bool:
        return not self.errors and all(r.verdict != "OOM" for r in self.roles)


class _Cfg:
    def __init__(self, cfg: DictConfig):
        self.cfg = cfg

    def __call__(self, key: str):
        return OmegaConf.select(self.cfg, key)


def device_capacity(cfg: DictConfig, ranks_per_host: int) -> tuple[float, str]:
    """GiB per device: trainer.device_memory_gb, else the visible CUDA device, else host RAM / ranks on it."""
    if cfg.trainer.device_memory_gb:
        return float(cfg.trainer.device_memory_gb), "trainer.device_memory_gb"
    if cfg.trainer.device == "cuda":
        try:
            import torch  # only when asked to measure: the plan itself stays import-light

            if torch.cuda.is_available():
                props = torch.cuda.get_device_properties(0)
                return props.total_memory / GIB, f"measured ({props.name})"
        except ImportError:
            pass
        return 80.0, "assumed 80 GiB (no CUDA device visible here; set trainer.device_memory_gb)"
    ram = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / GIB
    return ram / ranks_per_host, f"host RAM {ram:.1f} GiB / {ranks_per_host} ranks"


def frozen_dtype(fsdp) -> str:
    """What frozen weights are stored in: model_dtype, which the reward model's fsdp_config does not have (fp32)."""
    return getattr(fsdp, "model_dtype", "fp32")


def _training_state(arch: Arch, fsdp, shards: int, lora_rank: int, value_head: bool, trainable: bool, frozen: int = 0) -> dict:
    """GiB of one FSDP2 role's state on a device: resident weights, grads, optimizer, gathered weights. `frozen`:
    parameters of a trained model that get no gradients and no optimizer state (a frozen vision tower)."""
    p, layer, root = arch.params(value_head), arch.layer_params(), arch.root_params(value_head)
    compute = _BYTES[compute_dtype(fsdp)]
    lora = arch.lora_params(lora_rank) if lora_rank else 0
    if lora:
        weights = (p * _BYTES[fsdp.model_dtype] + lora * 4) / shards
        grads, optim = (lora * 4 / shards, lora * 8 / shards) if trainable else (0, 0)
    elif trainable:
        weights, grads, optim = p * 4 / shards, (p - frozen) * 4 / shards, (p - frozen) * 8 / shards
    else:  # frozen: stored in model_dtype (the reward model's section has none: fp32)
        weights, grads, optim = p * _BYTES[frozen_dtype(fsdp)] / shards, 0, 0
    gathered = (p + lora) * compute if not fsdp.reshard_after_forward else (root + 2 * layer) * compute
    if fsdp.offload_policy:
        weights = grads = optim = 0
    return {"weights": weights / GIB, "grads": grads / GIB, "optim": optim / GIB, "gathered": gathered / GIB}


def _megatron_state(arch: Arch, m: dict, value_head: bool, trainable: bool, lora_rank: int = 0) -> dict:
    """Megatron-core: weights (megatron.dtype) and the fp32 gradient buffer split over TP x PP; AdamW's two fp32
    moments (and fp32 master weights when the weights are 16-bit) also split over DP by the distributed optimizer.
    A MoE's routed experts split over expert-TP x EP x PP instead, their optimizer state over the expert-data-parallel
    ranks (the world over expert-TP x EP x PP). With LoRA (model.lora.rank) only the adapters have gradients and
    optimizer state (counted whole on every rank: half of each adapter is TP-split, the other half replicated)."""
    if lora_rank and trainable:
        base = _megatron_state(arch, m, value_head, False)
        lora = arch.lora_params(lora_rank) / m["pp"]
        master = 4 if _BYTES[m["cfg"].dtype] < 4 else 0
        dp = m["dp"] if m["cfg"].use_distributed_optimizer else 1
        return {**base, "weights": base["weights"] + lora * _BYTES[m["cfg"].dtype] / GIB, "grads": lora * 4 / GIB,
                "optim": lora * (8 + master) / dp / GIB}
    distributed = m["cfg"].use_distributed_optimizer
    parts = [(arch.params(value_head) - arch.routed_params(), m["tp"] * m["pp"], m["dp"]),  # (params, split, optimizer's DP)
             (arch.routed_params(), m["etp"] * m["ep"] * m["pp"], m["edp"])]
    weight_bytes = _BYTES[m["cfg"].dtype]
    master = 4 if weight_bytes < 4 else 0  # fp32 weights are their own master copy
    weights = sum(p * weight_bytes / split for p, split, _ in parts)
    grads = sum(p * 4 / split for p, split, _ in parts) if trainable else 0
    optim = sum(p * (8 + master) / (split * (dp if distributed else 1)) for p, split, dp in parts) if trainable else 0
    optim *= 1.0 - m.get("host_optim", 0.0)  # megatron-core's hybrid optimizer keeps that share on the host
    return {"weights": weights / GIB, "grads": grads / GIB, "optim": optim / GIB, "gathered": 0.0}


def _logits(arch: Arch, response_tokens: int, compute: int, backward: bool, tp: int = 1) -> float:
    """Bytes of the chunked log-prob head's working set: one chunk of `[chunk, vocab / tp]` logits."""
    vocab = -(-arch.vocab // tp)
    chunk = min(response_tokens, max(1, LOGITS_CHUNK_BYTES // (4 * vocab)))
    return chunk * vocab * (compute + 4 + 4 + (4 if backward else 0))


def _activations(arch: Arch, tokens: int, response_tokens: int, compute: int, ckpt: bool, backward: bool,
                 value_head: bool, tp: int = 1, sp: bool = False, offload: bool = False) -> tuple[float, float]:
    """(activation GiB, logits GiB) of one micro-batch of `tokens` tokens on one of `tp` tensor-parallel ranks:
    TP splits the attention and MLP intermediates; the hidden-size tensors too only with sequence parallelism.
    `offload` (model.enable_activation_offload, on an accelerator): the checkpointed block inputs live in host
    memory, and the device holds the one brought back for the block being recomputed."""
    h, kv, f = arch.hidden, arch.kv_heads * arch.dim, arch.mlp_width
    hidden_split = tp if sp else 1
    per_layer = compute * (6 * h / hidden_split + (2 * kv + 4 * f) / tp)  # bytes per token one block keeps for backward
    if not backward:
        act = tokens * compute * (2 * h / hidden_split + 2 * f / tp)  # one block's transient tensors
    elif ckpt:
        act = (1 if offload else arch.layers) * tokens * h * compute / hidden_split + tokens * per_layer
    else:
        act = arch.layers * tokens * per_layer
    logits = 0 if value_head else _logits(arch, response_tokens, compute, backward, tp)
    return act / GIB, logits / GIB


@dataclass
class _Role:
    """What the estimator needs to know about one trained/forward role, read from the config."""

    name: str
    arch: Arch
    section: str  # config section holding fsdp_config
    fsdp: object
    shards: int
    lora_rank: int
    value_head: bool
    tokens: int
    response_tokens: int
    budget_key: str
    ckpt: bool
    ckpt_key: str
    trainable: bool
    megatron: Optional[dict] = None  # {"cfg", "tp", "pp", "dp", "recompute"} under strategy=megatron
    sp: int = 1  # Ulysses: ranks sharing each micro-batch; `tokens` / `response_tokens` are one rank's slice
    offload_act: bool = False  # the policy's enable_activation_offload, on an accelerator (the actor on FSDP2)
    frozen: int = 0  # trained model's parameters without gradients (actor.freeze_vision_tower: the vision tower)


def _micro_tokens(c: _Cfg, dynamic_key: str, budget_key: str, micro: Optional[int], max_len: int, resp: int, sp: int = 1):
    """Tokens (all, response) of the largest micro-batch on one rank, and the key that sets it. With Ulysses (sp
    ranks share a micro-batch, each holding 1/sp of its tokens) a token budget is per rank (verl: budget x sp per
    micro-batch) and a micro-batch of rows is split sp ways."""
    if c(dynamic_key):
        budget = c(budget_key)
        return budget, min(budget, -(-budget * resp // max_len)), budget_key
    rows = micro or 1
    return -(-rows * max_len // sp), -(-rows * resp // sp), budget_key.replace("max_token_len", "micro_batch_size")


class Estimator:
    def __init__(self, cfg: DictConfig, plan, capacity: float, device: str):
        self.c, self.plan, self.capacity, self.device = _Cfg(cfg), plan, capacity, device
        self.resp = self.c("data.max_response_length") or 0  # PPO's lengths (absent from rlcore-rm / rlcore-sft configs)
        self.max_len = (self.c("data.max_prompt_length") or 0) + self.resp

    def _shards(self, fsdp, pool_world: int) -> int:
        return fsdp.fsdp_size if fsdp.fsdp_size and fsdp.fsdp_size > 0 else pool_world

    def training_role(self, name: str, arch: Arch, kind: str, world: int) -> _Role:
        c = self.c
        if kind == "critic":
            fsdp, sp = c("critic.fsdp"), self._sp("critic")
            micro = self.plan.critic_micro_batch_size_per_rank if self.plan else None  # the batch plan's, as the actor's
            toks = _micro_tokens(c, "critic.use_dynamic_bsz", "critic.ppo_max_token_len_per_gpu", micro, self.max_len, self.resp, sp)
            return _Role(name, arch, "critic.model", fsdp, self._shards(fsdp, world), c("critic.model.lora_rank"), True,
                         *toks, c("critic.model.enable_gradient_checkpointing"),
                         "critic.model.enable_gradient_checkpointing", True, self._megatron("critic", world), sp)
        if kind == "actor":
            micro, sp = (self.plan.ppo_micro_batch_size_per_rank if self.plan else None), self._sp("actor")
            toks = _micro_tokens(c, f"{ARR}.actor.use_dynamic_bsz", f"{ARR}.actor.ppo_max_token_len_per_gpu", micro,
                                 self.max_len, self.resp, sp)
            trainable, section = True, f"{ARR}.actor"
        else:  # reference log-probs
            micro, sp = (self.plan.ref_log_prob_micro_batch_size_per_rank if self.plan else None), self._sp("ref")
            toks = _micro_tokens(c, f"{ARR}.ref.log_prob_use_dynamic_bsz", f"{ARR}.ref.log_prob_max_token_len_per_gpu",
                                 micro, self.max_len, self.resp, sp)
            trainable, section = False, f"{ARR}.ref"
        fsdp = c(f"{section}.fsdp_config")
        return _Role(name, arch, section, fsdp, self._shards(fsdp, world), adapter_rank(c, f"{ARR}.model", f"{ARR}.actor.strategy"), False, *toks,
                     c(f"{ARR}.model.enable_gradient_checkpointing"), f"{ARR}.model.enable_gradient_checkpointing",
                     trainable, self._megatron(section, world), sp,
                     offload_act=trainable and bool(c(f"{ARR}.model.enable_activation_offload")) and self.device != "cpu",
                     frozen=arch.tower if trainable and c(f"{ARR}.actor.freeze_vision_tower") else 0)

    def _sp(self, role: str) -> int:
        """A role's Ulysses size on FSDP2 (1 under Megatron, whose validation refuses it)."""
        strategy = self.c("critic.strategy" if role == "critic" else f"{ARR}.{role}.strategy")
        return 1 if strategy == "megatron" else role_sp(self.c, role)

    def reward_role(self, name: str, arch: Arch, world: int) -> _Role:
        """The frozen reward model's forward (reward_model.*): a scalar head, no optimizer."""
        c, r = self.c, self.c("reward_model")
        max_len = r.max_length or self.max_len
        sp = role_sp(c, "reward_model")
        if uses_token_budgets(r):
            tokens, key = r.forward_max_token_len_per_gpu, "reward_model.forward_max_token_len_per_gpu"
        else:
            tokens, key = -(-(r.micro_batch_size_per_gpu or 1) * max_len // sp), "reward_model.micro_batch_size_per_gpu"
        fsdp = c("reward_model.model.fsdp_config")
        return _Role(name, arch, "reward_model.model", fsdp, self._shards(fsdp, world), 0, True, tokens, 0, key, False, "", False, sp=sp)

    def _megatron(self, section: str, world: int) -> Optional[dict]:
        """TP/PP/DP of a strategy=megatron role (None for FSDP2)."""
        if self.c(f"{section}.strategy") != "megatron":
            return None
        m = self.c(f"{section}.megatron")
        layout = Layout.from_config(m)  # as the engine derives it
        # The engine recomputes every layer with model.enable_gradient_checkpointing unless recompute_* says otherwise.
        granularity = m.override_transformer_config.get("recompute_granularity")
        ckpt_key = "critic.model.enable_gradient_checkpointing" if section == "critic" else f"{ARR}.model.enable_gradient_checkpointing"
        recompute = granularity == "full" or (granularity is None and bool(self.c(ckpt_key)))
        overrides = (self.c(f"{section}.optim.override_optimizer_config") if section != f"{ARR}.ref" else None) or {}
        host_optim = float(overrides.get("optimizer_offload_fraction", 1.0)) if overrides.get("optimizer_cpu_offload") else 0.0
        return {"cfg": m, "tp": layout.tp, "pp": layout.pp, "dp": layout.dp(world), "ep": layout.ep, "etp": layout.etp,
                "edp": layout.expert_dp(world), "recompute": recompute, "sp": layout.sp, "host_optim": host_optim}

    def state(self, role: _Role) -> dict:
        if role.megatron:
            return _megatron_state(role.arch, role.megatron, role.value_head, role.trainable, role.lora_rank)
        return _training_state(role.arch, role.fsdp, role.shards, role.lora_rank, role.value_head, role.trainable, role.frozen)

    def resident(self, role: _Role) -> float:
        """GiB a role keeps on the device while another role runs (offloaded between phases on request)."""
        s, off = self.state(role), (role.megatron["cfg"] if role.megatron else role.fsdp)
        keep = 0.0 if off.param_offload else s["weights"]
        if role.megatron and not off.grad_offload:
            keep += s["grads"]  # megatron keeps its contiguous gradient buffer allocated
        return keep + (0.0 if not role.trainable or off.optimizer_offload else s["optim"])

    def train_items(self, role: _Role) -> tuple[list, list]:
        if role.megatron:
            return self._megatron_items(role)
        s = self.state(role)
        compute = _BYTES[compute_dtype(role.fsdp)]
        offload = role.offload_act and role.ckpt
        act, logits = _activations(role.arch, role.tokens, role.response_tokens, compute, role.ckpt, role.trainable,
                                   role.value_head, offload=offload)
        what = "LoRA base + adapters" if role.lora_rank else ("fp32 master weights" if role.trainable else f"{frozen_dtype(role.fsdp)} weights (frozen)")
        items = [(f"{what} / {role.shards}", s["weights"])]
        if role.trainable:
            items += [(f"gradients / {role.shards}", s["grads"]), (f"AdamW moments / {role.shards}", s["optim"])]
        zero = "ZeRO-3: root + 2 blocks" if role.fsdp.reshard_after_forward else "ZeRO-2-like: all blocks"
        ulysses = f" (1/{role.sp} of each micro-batch: Ulysses)" if role.sp > 1 else ""
        items += [(f"gathered {compute_dtype(role.fsdp)} weights ({zero})", s["gathered"]),
                  (f"activations, {role.tokens} tokens{ulysses}" + (", checkpointed" if role.ckpt and role.trainable else "")
                   + (", inputs in host memory" if offload and role.trainable else ""), act)]
        if logits:
            items.append((f"log-prob head: one chunk of logits x {role.arch.vocab}", logits))
        if role.arch.vision is not None:
            patches, tower = tower_activations(role.arch.vision, role.tokens - role.response_tokens, compute, role.ckpt,
                                               role.trainable and not role.frozen)
            items.append((f"vision tower activations, <= {patches} patches (images filling the prompts)", tower))
        levers = []
        if role.trainable and not role.ckpt:
            ckpt_act, _ = _activations(role.arch, role.tokens, role.response_tokens, compute, True, True, role.value_head)
            levers.append((f"{role.ckpt_key}=True", act - ckpt_act))
        elif role.trainable and role.name == "actor update" and not offload and self.device != "cpu":
            host_act, _ = _activations(role.arch, role.tokens, role.response_tokens, compute, True, True, role.value_head, offload=True)
            levers.append((f"{ARR}.model.enable_activation_offload=True (block inputs in host memory)", act - host_act))
        smaller = self._smaller_budget(role)
        if smaller:
            levers.append((smaller, (act + logits) / 2))
        if not role.fsdp.reshard_after_forward:
            levers.append((f"{role.section}.fsdp_config.reshard_after_forward=True (ZeRO-3)",
                           s["gathered"] - (role.arch.root_params() + 2 * role.arch.layer_params()) * compute / GIB))
        if not role.fsdp.offload_policy and role.trainable:
            levers.append((f"{role.section}.fsdp_config.offload_policy=True (state on CPU, slower)",
                           s["weights"] + s["grads"] + s["optim"]))
        if role.trainable and not role.lora_rank:
            lora = _training_state(role.arch, role.fsdp, role.shards, 64, role.value_head, True)
            model = role.ckpt_key.rsplit(".", 1)[0]  # the section holding lora_rank: critic.model, ...model, model
            levers.append((f"{model}.lora_rank=64 {model}.lora_alpha=64 (LoRA; the reference becomes the base with adapters off)",
                           s["weights"] + s["grads"] + s["optim"] - lora["weights"] - lora["grads"] - lora["optim"]))
        return items, levers

    def _megatron_items(self, role: _Role) -> tuple[list, list]:
        m, s = role.megatron, self.state(role)
        section = f"{role.section}.megatron"
        compute = _BYTES[m["cfg"].dtype]
        split_kw = dict(tp=m["tp"], sp=m["sp"])
        # 1F1B: the first stage holds PP micro-batches of L/PP layers = L layers' worth of activations.
        act, logits = _activations(role.arch, role.tokens, role.response_tokens, compute, m["recompute"], role.trainable,
                                   role.value_head, **split_kw)
        split = f"TP{m['tp']} x PP{m['pp']}" + (f" (experts: EP{m['ep']} x ETP{m['etp']})" if role.arch.experts else "")
        items = [(f"{m['cfg'].dtype} weights / {split}", s["weights"])]
        if role.trainable:
            master = "fp32 master + AdamW" if compute < 4 else "AdamW moments"
            host = f", {m['host_optim']:.0%} of it on the host (optimizer_cpu_offload)" if m["host_optim"] else ""
            items += [(f"fp32 gradient buffer / {split}", s["grads"]), (f"{master} / {split} x DP{m['dp']}{host}", s["optim"])]
        items.append((f"activations, {role.tokens} tokens" + (", full recompute" if m["recompute"] else "")
                      + (", sequence parallel" if m["sp"] else ""), act))
        if logits:
            items.append((f"log-prob head: one chunk of logits x {role.arch.vocab} / TP", logits))
        levers = []
        if self._batches_split(2 * m["dp"]):
            levers.append((f"trainer.nnodes={2 * self.c('trainer.nnodes')} (the distributed optimizer splits AdamW over "
                           f"DP{m['dp'] * 2})", s["optim"] / 2))
        if self.c("trainer.nnodes") * self.c("trainer.n_gpus_per_node") % (m["tp"] * m["pp"] * 2) == 0 \
                and role.arch.layers % (m["pp"] * 2) == 0:
            # actor and reference share one layout (megatron_schema): both move together
            pair = [f"{ARR}.actor.megatron", f"{ARR}.ref.megatron"]
            keys = pair if section in pair and self.c(f"{ARR}.ref.strategy") == "megatron" else [section]
            levers.append((" ".join(f"{k}.pipeline_model_parallel_size={m['pp'] * 2}" for k in keys), (s["weights"] + s["grads"]) / 2))
        if role.trainable and not m["recompute"]:
            full, _ = _activations(role.arch, role.tokens, role.response_tokens, compute, True, True, role.value_head, **split_kw)
            levers.append((f"{section}.override_transformer_config.recompute_granularity=full", act - full))
        if m["tp"] > 1 and not m["sp"]:
            with_sp, _ = _activations(role.arch, role.tokens, role.response_tokens, compute, m["recompute"], role.trainable,
                                      role.value_head, tp=m["tp"], sp=True)
            levers.append((f"{section}.sequence_parallel=True", act - with_sp))
        smaller = self._smaller_budget(role)
        if smaller:
            levers.append((smaller, (act + logits) / 2))
        return items, levers

    def _smaller_budget(self, role: _Role) -> Optional[str]:
        """`key=value` halving a role's micro-batch: a token budget down to half (not below one full-length
        sequence, which the validator requires), or a micro-batch size down to its largest proper divisor (which
        still divides whatever the old size divided); None when it cannot shrink."""
        if "max_token_len" in role.budget_key:
            half = role.tokens // 2
            return f"{role.budget_key}={half}" if half >= self.max_len else None
        micro = self.c(role.budget_key)
        if not micro or micro < 2:
            return None
        smaller = max(d for d in range(1, micro) if micro % d == 0)
        return f"{role.budget_key}={smaller}"

    def _batches_split(self, dp: int) -> bool:
        """Whether the step's and mini-batch's samples still split into whole micro-batches over `dp` ranks."""
        p = self.plan
        if p is None:
            return False
        micro = p.ppo_micro_batch_size_per_rank
        return (p.samples_per_step % dp == 0 and p.samples_per_mini_batch % dp == 0
                and (micro is None or (p.samples_per_mini_batch // dp) % micro == 0))

    def rollout(self, arch: Arch, world: int) -> tuple[list, str, list, float]:
        """(items, note, levers, resident GiB while asleep) of the rollout engine on one device (rlcore.plan.rollout_memory)."""
        return rollout_memory(self, arch, world)


def offload_levers(est: Estimator, role: _Role) -> list[tuple[str, float]]:
    """The offload flags that take a role's state off the device between its phases, and what that frees."""
    kept = est.resident(role)
    if kept <= 0:
        return []
    flags = (["param_offload", "grad_offload", "optimizer_offload"] if role.megatron else
             ["param_offload"] + (["optimizer_offload"] if role.trainable else []))
    if role.section == "critic.model":  # the critic's engine sections sit beside its model (verl 0.9's critic.fsdp)
        where = "critic.megatron" if role.megatron else "critic.fsdp"
    else:
        where = f"{role.section}.megatron" if role.megatron else f"{role.section}.fsdp_config"
    if role.section.endswith(".inference"):  # a distillation teacher's own offload key
        where = role.section
    off = role.megatron["cfg"] if role.megatron else role.fsdp
    todo = [f"{where}.{flag}=True" for flag in flags if hasattr(off, flag) and not getattr(off, flag)]
    return [(" ".join(todo) + " (between phases, slower)", kept)] if todo else []


def memory_plan(cfg: DictConfig, plan) -> MemoryPlan:
    """Estimates every role's per-device peak for a composed config (the BatchPlan may be None)."""
    from rlcore.config.validate import uses_critic, uses_reference

    c, t = _Cfg(cfg), cfg.trainer
    world, errors, notes = t.nnodes * t.n_gpus_per_node, [], []
    critic, reward = uses_critic(cfg), bool(c("reward.reward_model.enable"))
    # The device pools as the controller places the groups: which roles share a device, and how many devices each has.
    pools, where = placement(cfg)
    pool_world = [(nodes or 0) * (per_node or 0) for nodes, per_node in pools]  # a pool left unsized: the validator says so
    pool_of = {"actor": where["actor_rollout"]} | {role: where[key] for role, key in (("critic", "critic"), ("reward", "reward_model"),
                                                                                     ("teacher", "teacher")) if key in where}
    procs = {pool: sum(p == pool for p in pool_of.values()) for pool in set(pool_of.values())}  # processes per device
    # Split pools (hybrid_engine=False): the rollout has devices of its own, holding nothing of training's.
    split = "rollout" in where
    rollout_pool = where.get("rollout", where["actor_rollout"])
    rollout_world = pool_world[rollout_pool]
    procs.setdefault(rollout_pool, 1)
    capacity, source = device_capacity(cfg, t.n_gpus_per_node * procs[0])
    est = Estimator(cfg, plan, capacity, t.device)
    archs = {}
    for path_key, key in ((f"{ARR}.model.path", "policy"), ("critic.model.path", "critic"), ("reward.reward_model.model_path", "reward model")):
        if key == "critic" and not critic or key == "reward model" and not reward:
            continue
        arch, where = resolve_arch(c(path_key)) if c(path_key) else (None, "no model path")
        archs[key] = arch
        if arch is None:
            notes.append(f"{key}: not estimated: {where}; set {path_key} to a directory with config.json")
            continue
        value = key != "policy"
        count = arch.params(value)
        size = f"{count / 1e9:.2f}B" if count >= 1e9 else f"{count / 1e6:.2f}M"
        if arch.experts:  # what a token computes with, beside what the ranks hold
            size += f" ({arch.active_params(value) / 1e9:.2f}B active: top-{arch.top_k} of {arch.experts} experts per layer)"
        notes.append(f"{key}: {size} params, {arch.layers} layers, hidden {arch.hidden}, "
                     f"vocab {arch.vocab} ({where}{'; ' + arch.estimated if arch.estimated else ''})")
        if key == "policy":
            notes.append(f"{key} cache: {arch.cache_summary()}")
        if key == "policy":
            errors += head_errors(cfg, arch, path_key)
        if key == "policy" and arch.max_positions and est.max_len > arch.max_positions:
            errors.append(f"data.max_prompt_length + data.max_response_length = {est.max_len} exceeds {path_key}'s "
                          f"max_position_embeddings {arch.max_positions}; use data.max_response_length="
                          f"{max(1, arch.max_positions - c('data.max_prompt_length'))} or a shorter prompt length")

    def runtime(pool: int) -> tuple[str, float]:
        n = procs[pool]
        return "runtime" + (f" x {n} processes (colocated worker groups)" if n > 1 else ""), runtime_gib(t.device) * n

    roles, phases = [], []  # phases: (name, role, pool)
    if archs["policy"] is not None:
        phases.append(("actor update", est.training_role("actor update", archs["policy"], "actor", world), 0))
        if uses_reference(cfg) and not adapter_rank(c, f"{ARR}.model", f"{ARR}.actor.strategy"):  # with LoRA the reference is the base, adapters off
            phases.append(("reference log-probs", est.training_role("reference log-probs", archs["policy"], "ref", world), 0))
    if critic and archs["critic"] is not None:
        pool = pool_of["critic"]
        phases.append(("critic update", est.training_role("critic update", archs["critic"], "critic", pool_world[pool]), pool))
    if reward and archs["reward model"] is not None:
        pool = pool_of["reward"]
        phases.append(("reward model scores", est.reward_role("reward model scores", archs["reward model"], pool_world[pool]), pool))
    teachers = ([], [], {})
    if "teacher" in pool_of:
        teachers = teacher_phases(est, cfg, _Role, pool_of["teacher"], pool_world[pool_of["teacher"]], capacity)
    notes += teachers[0]
    phases += teachers[1]
    resident = {name: (est.resident(role), pool) for name, role, pool in phases} | teachers[2]
    rollout_items, rollout_note, rollout_levers, rollout_asleep = ([], "", [], 0.0)
    if archs["policy"] is not None:
        rollout_items, rollout_note, rollout_levers, rollout_asleep = est.rollout(archs["policy"], rollout_world)
        rollout_asleep = 0.0 if split else rollout_asleep
    # free_cache_engine=False: the engine never sleeps, so all it holds stays beside every training phase.
    awake = not c(f"{ARR}.rollout.free_cache_engine")
    if awake and not split:
        rollout_asleep = sum(gib for _, gib in rollout_items)
    kept_rollout = "rollout engine awake (free_cache_engine=False)" if awake else "rollout engine asleep"

    def others(me: str, pool: int) -> list:
        shared = [(f"{name.split()[0] if name != 'reward model scores' else 'reward model'} state kept between phases", gib)
                  for name, (gib, where) in resident.items() if name != me and gib > 0 and where == pool]
        return shared + ([(kept_rollout, rollout_asleep)] if pool == 0 and me != "rollout" and rollout_asleep else [])

    if archs["policy"] is not None:
        role = RoleMemory("rollout", f"{rollout_world} devices" + (", own pool" if split else ""),
                          rollout_items + others("rollout", rollout_pool) + [runtime(rollout_pool)], capacity, rollout_note, rollout_levers)
        role.levers += rollout_sizing(c(f"{ARR}.rollout.name")).share_levers(est, role.peak, rollout_items[0][1], FIT)
        role.levers += [lever for name, spec, pool in phases if pool == rollout_pool for lever in offload_levers(est, spec)]
        roles.append(role)
    for name, spec, pool in phases:
        items, levers = est.train_items(spec)
        where = f"{spec.shards if not spec.megatron else world} devices" + (", shared with the rollout" if pool == rollout_pool else ", own pool")
        roles.append(RoleMemory(name, where, items + others(name, pool) + [runtime(pool)], capacity, "", levers))
    for role in roles:
        role.levers.sort(key=lambda lever: -lever[1])
    return MemoryPlan(capacity, source, notes, roles, errors)


def supervised_memory_plan(cfg: DictConfig, pairs: bool) -> MemoryPlan:
    """The one role of an rlcore-rm (`pairs`: both sequences of a pair in each micro-batch, a scalar head) or an
    rlcore-sft run: the FSDP2 update of `model.*` on every device, micro-batches of data.micro_batch_size_per_gpu
    rows x data.max_length tokens (or data.max_token_len_per_gpu)."""
    t, d, m = cfg.trainer, cfg.data, cfg.model
    world = t.nnodes * t.n_gpus_per_node
    capacity, source = device_capacity(cfg, t.n_gpus_per_node)
    arch, where = resolve_arch(m.path)
    if arch is None:
        return MemoryPlan(capacity, source, [f"model: not estimated: {where}; set model.path to a directory with config.json"], [], [])
    name = "reward model update" if pairs else "SFT update"
    notes = [f"model: {arch.params(pairs) / 1e9:.2f}B params, {arch.layers} layers, hidden {arch.hidden}, vocab {arch.vocab} ({where})"]
    errors = []
    if arch.max_positions and d.max_length > arch.max_positions:
        errors.append(f"data.max_length={d.max_length} exceeds model.path's max_position_embeddings {arch.max_positions}; "
                      f"use data.max_length={arch.max_positions}")
    if d.use_dynamic_bsz:
        tokens, key = d.max_token_len_per_gpu, "data.max_token_len_per_gpu"
    else:
        tokens, key = d.micro_batch_size_per_gpu * d.max_length * (2 if pairs else 1), "data.micro_batch_size_per_gpu"
    fsdp = m.fsdp_config
    shards = fsdp.fsdp_size if fsdp.fsdp_size and fsdp.fsdp_size > 0 else world
    role = _Role(name, arch, "model", fsdp, shards, m.lora_rank, pairs, tokens, 0 if pairs else tokens, key,
                 m.enable_gradient_checkpointing, "model.enable_gradient_checkpointing", True)
    items, levers = Estimator(cfg, None, capacity, t.device).train_items(role)
    levers.sort(key=lambda lever: -lever[1])
    memory = RoleMemory(name, f"{shards} devices", items + [("runtime", runtime_gib(t.device))], capacity, "", levers)
    return MemoryPlan(capacity, source, notes, [memory], errors)


def format_memory(mem: MemoryPlan, fold_below: float = 0.0) -> str:
    """A line per role and per part; parts under `fold_below` GiB share one (a tiny model's were ~25 lines of 0.00)."""
    lines = [f"memory plan: {mem.capacity:.1f} GiB per device ({mem.capacity_source})"]
    lines += [f"memory plan: {note}" for note in mem.arch_notes]
    width = max((len(r.role) for r in mem.roles), default=4)
    for r in mem.roles:
        lever = r.levers[0] if r.levers and r.verdict != "fits" else None
        pull = f"; largest lever: {lever[0]} (-{lever[1]:.1f} GiB)" if lever else ""
        lines.append(f"memory plan: {r.role:<{width}}  {r.peak:7.1f} GiB = {100 * r.peak / r.capacity:3.0f}%  "
                     f"{r.verdict.upper() if r.verdict == 'OOM' else r.verdict}{pull}")
        small = [what for what, gib in r.items if gib < fold_below]
        lines += [f"memory plan:   {'':<{width}}{gib:7.2f}  {what}" for what, gib in r.items if gib >= fold_below]
        if small:
            folded = sum(g for _, g in r.items if g < fold_below)
            lines.append(f"memory plan:   {'':<{width}}{folded:7.2f}  {len(small)} parts of under {fold_below} GiB each (rlcore-plan lists them)")
        if r.note:
            lines.append(f"memory plan:   {'':<{width}}  {r.note}")
    return "\n".join(lines)
