"""Sharded weights (FSDP2's ``DTensor`` parameters) for algorithms that copy or average whole weights.

Torch only. Under FSDP2 (``torch.distributed.fsdp.fully_shard``) each parameter is a ``DTensor``
whose local part is this rank's shard; elementwise arithmetic on two such tensors works shard by
shard. Three things need care, and this module does them:

- after an evaluation forward FSDP2 may leave the root module's parameters gathered (plain
  tensors registered in place of the shards): :func:`reshard` puts the shards back before an
  algorithm copies weights in or out;
- a checkpoint written by rank zero alone must hold whole tensors, not rank zero's shard:
  :func:`full_tensor` gathers (a collective: every rank calls it, as Lightning does when it
  collects callback state);
- whole tensors loaded from a checkpoint are sharded again like the parameter they belong to:
  :func:`like` (no communication: every rank keeps its own slice).

Examples:
    >>> import torch
    >>> t = torch.ones(2)
    >>> full_tensor(t) is t, is_sharded(torch.nn.Linear(2, 2))
    (True, False)
"""

from __future__ import annotations

import functools

import torch

from composer_bridge.core import torch_versions

__all__ = ["full_tensor", "is_dtensor", "is_sharded", "like", "local_slice", "reshard", "sharding_kind"]


@functools.cache
def _dtensor_class() -> type | None:
    if not torch.distributed.is_available():  # pragma: no cover - torch built without distributed
        return None
    from torch.distributed.tensor import DTensor

    return DTensor


@functools.cache
def _fsdp_module_class() -> type | None:
    if not torch.distributed.is_available():  # pragma: no cover
        return None
    from torch.distributed.fsdp import FSDPModule

    return FSDPModule


def is_dtensor(tensor: object) -> bool:
    """Whether ``tensor`` is a ``DTensor`` (a shard of a distributed tensor)."""
    cls = _dtensor_class()
    return cls is not None and isinstance(tensor, cls)


def sharding_kind(model: torch.nn.Module) -> str | None:
    """What marks ``model`` as sharded, in words (``None`` when it is not), for error messages."""
    fsdp = _fsdp_module_class()
    if fsdp is not None:
        sharded = [name or "<root>" for name, m in model.named_modules() if isinstance(m, fsdp)]
        if sharded:
            return f"FSDPModule (fully_shard) on {', '.join(sharded[:3])}{' ...' if len(sharded) > 3 else ''}"
    names = [name for name, p in model.named_parameters() if is_dtensor(p)]
    if names:
        return f"DTensor parameters ({', '.join(names[:3])}{' ...' if len(names) > 3 else ''})"
    return None


def is_sharded(model: torch.nn.Module) -> bool:
    """Whether ``model`` holds FSDP2 modules or ``DTensor`` parameters."""
    return sharding_kind(model) is not None


def reshard(model: torch.nn.Module) -> None:
    """Put every FSDP2 module of ``model`` back to its sharded parameters (no-op when none is gathered)."""
    fsdp = _fsdp_module_class()
    if fsdp is None:  # pragma: no cover
        return
    for module in model.modules():
        if isinstance(module, fsdp):
            module.reshard()


def full_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """The whole tensor of a ``DTensor`` (a collective: every rank must call it); other tensors as they are."""
    return tensor.full_tensor() if is_dtensor(tensor) else tensor  # type: ignore[attr-defined]


def like(stored: torch.Tensor, reference: torch.Tensor) -> torch.Tensor:
    """``stored`` on ``reference``'s device and dtype, and sharded like it when it is a ``DTensor``.

    A whole tensor (from a checkpoint) becomes this rank's slice of a ``DTensor`` with the
    reference's mesh and placements, without communication; a ``DTensor`` for a plain reference is
    gathered (a collective).
    """
    if is_dtensor(reference) and not is_dtensor(stored):
        whole = stored.to(device=reference.device, dtype=reference.dtype)
        mesh, placements = reference.device_mesh, reference.placements  # type: ignore[attr-defined]
        if torch_versions.at_least(torch_versions.DISTRIBUTE_TENSOR_SLICES_LOCALLY):
            from torch.distributed.tensor import distribute_tensor

            return distribute_tensor(whole, mesh, placements, src_data_rank=None)
        return local_slice(whole, mesh, placements)
    if is_dtensor(stored) and not is_dtensor(reference):
        stored = full_tensor(stored)
    if stored.device != reference.device or stored.dtype != reference.dtype:
        return stored.to(device=reference.device, dtype=reference.dtype)
    return stored


def local_slice(whole: torch.Tensor, mesh: object, placements: tuple) -> torch.Tensor:
    """This rank's part of ``whole`` as a ``DTensor`` on ``mesh`` with ``placements``, without communication.

    What ``distribute_tensor(..., src_data_rank=None)`` does on torch 2.7 and newer, for the
    placements parameters have (``Shard(dim)`` and ``Replicate()``): a shard is this rank's piece of
    ``torch.chunk`` along the sharded dimension, as torch splits it (the last pieces may be smaller,
    or empty). Every rank holds the same ``whole`` (read from a checkpoint).
    """
    from torch.distributed.tensor import DTensor, Replicate, Shard

    local = whole
    coordinate = mesh.get_coordinate()  # type: ignore[attr-defined]
    for mesh_dim, placement in enumerate(placements):
        if isinstance(placement, Shard):
            pieces = torch.chunk(local, mesh.size(mesh_dim), dim=placement.dim)  # type: ignore[attr-defined]
            index = coordinate[mesh_dim]
            if index < len(pieces):
                local = pieces[index]
            else:  # fewer rows than ranks: this rank's shard is empty
                shape = list(local.shape)
                shape[placement.dim] = 0
                local = local.new_empty(shape)
        elif not isinstance(placement, Replicate):
            raise ValueError(f"cannot slice a whole tensor for placement {placement!r}: only Shard(dim) and Replicate() "
                             "are supported (the placements of FSDP2 and tensor-parallel parameters)")
    return DTensor.from_local(local.contiguous(), mesh, placements, run_check=False,  # type: ignore[arg-type]
                              shape=whole.shape, stride=whole.stride())
