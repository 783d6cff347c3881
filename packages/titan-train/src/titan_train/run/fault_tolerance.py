"""Replica groups with torchft (config `[fault_tolerance]`): the trainer's step calls the same hooks whether
the job is one group or several; `SingleGroup` answers them as a plain run, `ReplicaGroups` through torchft's
`Manager`.

A step with replica groups: a quorum of the live groups (torchft's lighthouse); a group that is behind (just
restarted) heals here, copying weights, optimizer, LR schedule, step and data position from the same group
rank of a live group; every group computes its share of the global batch; the gradients (each rank's shards:
every group has the same layout) are averaged over the live groups; the step commits only if no group failed
during it, else the live groups redo it with the same batches (no step, no sequence lost by the survivors).

With r of n groups live, a step trains r/n of the global batch: the shares of the dead groups are not
trained (lost, never retried). The gradient is the mean over the trained sequences (torchft divides the sum
by the live count), so its scale does not change with r; the learning rate is not rescaled.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.tensor import DTensor

from titan_train.config.sections import FaultTolerance
from titan_train.run.distributed import RunEnv
from titan_train.run.semi_sync import build_semi_sync

logger = logging.getLogger("titan")


class SingleGroup:
    """The job is one group: nothing to agree on with anyone."""

    def data_share(self, dp_rank: int, dp: int) -> tuple[int, int]:
        return dp_rank, dp

    def attach(self, states: dict[str, Any], step: int, parts: list, optimizers: list) -> None:
        pass

    def start_step(self) -> None:
        pass

    def average_gradients(self, parameters) -> None:
        pass

    def average(self, value: float) -> float:
        return value

    def maximum(self, tensor: torch.Tensor) -> None:
        pass

    def should_commit(self) -> bool:
        return True

    def writes_checkpoints(self) -> bool:
        return True

    def live(self) -> str | None:
        return None

    def close(self) -> None:
        pass


class ReplicaGroups:
    """This group's side of a torchft job: `group_size` groups, this one `replica_id`."""

    def __init__(self, cfg: FaultTolerance, env: RunEnv):
        # torchft logs every quorum and commit at INFO (its Rust side reads RUST_LOG at import): the step line's
        # "replicas" says what a person needs; warnings (a failed group, a step not committed) still show.
        os.environ.setdefault("RUST_LOG", "warn")
        for name in ("torchft", "torchft_quorums", "torchft_commits", "torchft_errors"):
            logging.getLogger(name).setLevel(logging.WARNING)
        logging.getLogger("torchft.manager").addFilter(_drop_flight_recorder_notice)
        from torchft import Manager, ProcessGroupGloo, ProcessGroupNCCL

        self.cfg = cfg
        timeout = timedelta(seconds=cfg.timeout_seconds)
        host, port = _fresh_group_store(env)
        pg = ProcessGroupNCCL(timeout=timeout) if env.device.type == "cuda" else ProcessGroupGloo(timeout=timeout)
        self.manager = Manager(
            pg=pg, load_state_dict=None, state_dict=None, min_replica_size=cfg.min_replica_size,
            # Synchronous quorum: a healing group loads its peer's state before its forward, then takes part in
            # the step like the others (with an asynchronous quorum it would sit that step out).
            use_async_quorum=False,
            # Every group initializes the same weights from training.seed (or loads the same checkpoint).
            init_sync=False,
            timeout=timeout, quorum_timeout=timeout, connect_timeout=timeout,
            rank=env.rank, world_size=env.world_size, store_addr=host, store_port=port,
            lighthouse_addr=cfg.lighthouse_address or os.environ["TORCHFT_LIGHTHOUSE"],
            replica_id=f"titan_group_{cfg.replica_id}",
        )  # fmt: skip
        # Every rank of this group builds it here, at the same point of start-up, as new_group requires.
        self._barrier_group = dist.new_group(backend="gloo", timeout=timeout) if dist.is_initialized() else None
        self._states: dict[str, Any] = {}
        # local_sgd / diloco: groups agree (quorum, averaging, commit) only every sync_steps, after the optimizer
        # step (semi_sync.py); the per-step hooks below then leave each group to itself.
        self._per_step = cfg.semi_sync_method == "none"
        self._steps_per_sync = 1 if self._per_step else cfg.sync_steps
        self._semi_sync = None
        self._last_live = cfg.group_size  # the participants of the last quorum, for _log_membership
        self._started = False  # whether this process has had its first quorum (start_step)

    def data_share(self, dp_rank: int, dp: int) -> tuple[int, int]:
        """This rank's place among the data-parallel ranks of all groups: group g's ranks come after those of
        groups 0 .. g-1, so n groups of dp ranks read what one run of n x dp ranks reads."""
        return self.cfg.replica_id * dp + dp_rank, self.cfg.group_size * dp

    def attach(self, states: dict[str, Any], step: int, parts: list, optimizers: list) -> None:
        """Serve `states` (name -> object with state_dict / load_state_dict) to healing peers and load them when
        this group heals; `step`: where this group starts (a loaded checkpoint's), which torchft compares (it
        counts synchronisations: one per step, or one per sync_steps with semi_sync_method). `parts`,
        `optimizers`: the model and its optimizer, which local_sgd / diloco synchronise after optimizer steps."""
        self._states = states
        self.manager.register_state_dict_fn("titan", self._load, self._state_dict)
        self.manager.load_state_dict({"step": step // self._steps_per_sync, "batches_committed": 0})
        self._semi_sync = build_semi_sync(self.cfg, self.manager, parts, optimizers)

    def _state_dict(self) -> dict[str, Any]:
        # Local shards only: the peer rank that reads them holds the same shards of the same layout.
        return {name: _tree_map(state.state_dict(), _to_local) for name, state in self._states.items()}

    def _load(self, received: dict[str, Any]) -> None:
        for name, state in self._states.items():
            state.load_state_dict(_like(state.state_dict(), received[name]))
        step = received.get("train_state", {}).get("step")
        logger.info(
            f"fault tolerance: healed from a live replica group at step {step} (weights, optimizer, LR schedule, "
            "step, data position); this group's rows of the steps it missed are not trained"
        )

    def start_step(self) -> None:
        if not self._per_step:
            return
        self._join_quorum()
        # A job starts with all its groups, whichever started first, fresh or resumed from a checkpoint: else the
        # first one up trains alone and the others heal from it (correct, but the run would depend on start-up
        # timing). A group restarted alone finds the others in its first quorum, or waits for them as long.
        deadline = time.monotonic() + self.cfg.timeout_seconds
        while not self._started and self.manager.num_participants() < self.cfg.group_size:
            if time.monotonic() > deadline:
                logger.warning(f"fault tolerance: starting with replica groups {self.live()}")
                break
            time.sleep(0.1)
            self._join_quorum()
        self._started = True
        self._log_membership()

    def _join_quorum(self) -> None:
        """torchft's quorum, asked again when it times out while every rank of this group is here.

        A group with a hung rank that never asked for the quorum still heartbeats through its manager (its rank
        0), and the lighthouse forms no quorum of a minority of the heartbeating groups: every group's quorum
        times out. Which group is the broken one, each learns from a barrier of its own ranks: the group whose
        ranks all answer asks again (the quorum forms once the broken group's manager has exited); the group
        with a silent rank fails, so that its launcher restarts it and it heals from the others."""
        while True:
            try:
                self.manager.start_quorum()
                return
            except TimeoutError as error:
                if not self._all_ranks_answer():
                    raise RuntimeError(
                        f"fault tolerance: replica group {self.cfg.replica_id} got no quorum within "
                        f"fault_tolerance.timeout_seconds ({self.cfg.timeout_seconds} s) and a rank of this group "
                        "did not answer a barrier within as long: the group fails, for its launcher to restart it"
                    ) from error
                logger.warning(
                    f"fault tolerance: no quorum within fault_tolerance.timeout_seconds ({self.cfg.timeout_seconds} "
                    "s), every rank of this group answers: another group is hung; asking again"
                )
                # torchft keeps the failed quorum's future and start_quorum() would raise its error again.
                self.manager._quorum_future = None

    def _all_ranks_answer(self) -> bool:
        """A barrier of this group's ranks (gloo, CPU: whatever the training backend) within timeout_seconds."""
        if self._barrier_group is None:
            return True  # one process, not launched by torchrun: it is here
        try:
            dist.monitored_barrier(self._barrier_group, timeout=timedelta(seconds=self.cfg.timeout_seconds))
            return True
        except RuntimeError:
            return False

    def _log_membership(self) -> None:
        """Say, when it changes, how many groups train the steps from this one and what that means for the data."""
        live = self.manager.num_participants()
        if live == self._last_live:
            return
        self._last_live, step, n = live, self.manager.current_step() + 1, self.cfg.group_size
        if live < n:
            logger.warning(
                f"fault tolerance: from step {step}, {live} of {n} replica groups train: each step trains {live}/{n} "
                f"of the global batch (the rows of the missing groups are skipped, not trained later); the gradient "
                f"is the mean over the rows trained"
            )
        else:
            logger.info(f"fault tolerance: from step {step}, all {n} replica groups train")

    @torch.no_grad()
    def average_gradients(self, parameters) -> None:
        """Each gradient (this rank's shard) averaged over the live groups' same shard: one flat buffer per
        dtype, one collective each (and one error, not one per parameter, when a group dies during it)."""
        if not self._per_step:
            return
        by_dtype: dict[torch.dtype, list[torch.Tensor]] = {}
        for p in parameters:
            if p.grad is not None:
                grad = _to_local(p.grad)
                by_dtype.setdefault(grad.dtype, []).append(grad)
        for grads in by_dtype.values():
            flat = torch.cat([g.reshape(-1) for g in grads])
            self.manager.allreduce(flat).wait()
            for grad, averaged in zip(grads, flat.split([g.numel() for g in grads]), strict=True):
                grad.copy_(averaged.view_as(grad))

    def average(self, value: float) -> float:
        """`value` averaged over the live groups (the step's loss over the whole trained batch); with local_sgd /
        diloco, this group's own."""
        if not self._per_step:
            return value
        tensor = torch.tensor([value], dtype=torch.float64)
        self.manager.allreduce(tensor).wait()
        return tensor.item()

    def maximum(self, tensor: torch.Tensor) -> None:
        """`tensor` <- its elementwise maximum over the live groups (QK-clip's largest logits: one decision in every
        group, as their weights must stay equal); with local_sgd / diloco, this group's own. A group healing this
        step sends zeros (torchft's rule for a group that does not participate): a maximum it joins is never below
        0, which changes no decision (a clip threshold is positive)."""
        if self._per_step:
            self.manager.allreduce(tensor, reduce_op=dist.ReduceOp.MAX).wait()

    def should_commit(self) -> bool:
        if not self._per_step:
            return True  # a local step; the synchronisation commits or not on its own
        committed = self.manager.should_commit()
        if not committed:
            logger.warning(
                f"fault tolerance: step {self.manager.current_step() + 1} not committed (a replica group failed "
                "during it); the live groups redo it with the same batches"
            )
        return committed

    def writes_checkpoints(self) -> bool:
        """The lowest live group writes the checkpoints (every rank of a group agrees: one quorum answer); before
        the first quorum (local_sgd / diloco: the first synchronisation), group 0."""
        rank = self.manager.participating_rank()
        return rank == 0 if rank is not None else self.cfg.replica_id == 0

    def live(self) -> str | None:
        live = self.manager.num_participants()  # at the last quorum; 0 before the first (semi-sync)
        return f"{live}/{self.cfg.group_size}" if live else None

    def close(self) -> None:
        if self._semi_sync is not None:
            self._semi_sync.__exit__(None, None, None)
        self.manager.shutdown(wait=False)


def build_replica_groups(cfg: FaultTolerance, env: RunEnv) -> SingleGroup | ReplicaGroups:
    return ReplicaGroups(cfg, env) if cfg.enable else SingleGroup()


class OneGroupSaves:
    """A checkpoint manager whose saves only the writing group makes; everything else passes through."""

    def __init__(self, checkpoint, groups: SingleGroup | ReplicaGroups):
        self._checkpoint, self._groups = checkpoint, groups

    def save(self, step: int, last: bool = False) -> None:
        if self._groups.writes_checkpoints():
            self._checkpoint.save(step, last=last)

    def __getattr__(self, name: str):
        return getattr(self._checkpoint, name)


def _drop_flight_recorder_notice(record: logging.LogRecord) -> bool:
    # Warned at every quorum change where the NCCL flight recorder is absent (CPU, gloo): nothing to act on.
    return "Unable to reset NCCL flight recorder" not in record.getMessage()


def _fresh_group_store(env: RunEnv) -> tuple[str, int]:
    """A TCPStore of this start of the group, for torchft's manager and cross-group process groups. torchrun's
    store outlives restarts (rendezvous.py), and the manager reads its keys unprefixed: a restarted rank could
    read the dead group's manager address."""
    host = os.environ.get("MASTER_ADDR") or socket.gethostname()
    port = [0]
    if env.rank == 0:
        store = dist.TCPStore(host, 0, is_master=True, wait_for_workers=False)
        _KEEP_ALIVE.append(store)  # the store serves as long as this process lives
        port = [store.port]
    if dist.is_initialized():
        dist.broadcast_object_list(port, src=0)
    return host, port[0]


_KEEP_ALIVE: list = []


def _to_local(value):
    return value.to_local() if isinstance(value, DTensor) else value


def _tree_map(tree, fn):
    if isinstance(tree, dict):
        return {k: _tree_map(v, fn) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return type(tree)(_tree_map(v, fn) for v in tree)
    return fn(tree)


def _like(template, received):
    """`received` (local shards) shaped as `template` (this rank's own state): each DTensor rebuilt on this
    rank's mesh and placements."""
    # Plain data (a dataloader's token buffer) may differ in shape from ours: the received one is taken as is.
    if isinstance(template, dict) and isinstance(received, dict):
        return {k: _like(template[k], v) if k in template else v for k, v in received.items()}
    if isinstance(template, (list, tuple)) and isinstance(received, (list, tuple)) and len(template) == len(received):
        return type(received)(_like(t, r) for t, r in zip(template, received, strict=True))
    if isinstance(template, DTensor):
        return DTensor.from_local(
            received.to(template.device), template.device_mesh, template.placements,
            run_check=False, shape=template.shape, stride=template.stride(),
        )  # fmt: skip
    if isinstance(received, torch.Tensor) and isinstance(template, torch.Tensor):
        return received.to(template.device)
    return received
