"""Every torch-version fact in ``composer_bridge/core/torch_versions.py``, checked against the installed torch.

Each test asks torch itself (a signature, a run) and compares the answer with the version the fact
names, so on a torch where the fact no longer holds (a backport, a removal, a release that moves
the feature) the test of that fact fails by name. CI runs these on the oldest and the newest torch.
"""

from __future__ import annotations

import inspect
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from composer_bridge.core import torch_versions

REPO = Path(__file__).resolve().parents[2]


def test_the_oldest_supported_torch_is_the_bound_pyproject_declares() -> None:
    bound = re.search(r'^\s*"torch>=([0-9.]+)"', (REPO / "pyproject.toml").read_text(), re.MULTILINE)
    assert bound, "no torch>= bound in pyproject.toml"
    assert tuple(int(p) for p in bound.group(1).split(".")[:2]) == torch_versions.OLDEST_SUPPORTED


def test_the_installed_torch_is_in_the_supported_range() -> None:
    assert torch_versions.at_least(torch_versions.OLDEST_SUPPORTED), torch.__version__


def test_at_least_compares_major_and_minor_of_the_installed_torch() -> None:
    major, minor = (int(p) for p in torch.__version__.split(".")[:2])
    assert torch_versions.at_least((major, minor)) and torch_versions.at_least((major, minor - 1))
    assert torch_versions.at_least((major - 1, 99))
    assert not torch_versions.at_least((major, minor + 1)) and not torch_versions.at_least((major + 1, 0))


def test_require_names_the_feature_the_torch_it_needs_the_installed_one_and_the_fix() -> None:
    torch_versions.require(torch_versions.OLDEST_SUPPORTED, "x", "y")
    with pytest.raises(RuntimeError, match=rf"^FSDP3 needs torch>=99\.1; this is torch {re.escape(torch.__version__)}\. "
                                            r"Fix: upgrade torch$"):
        torch_versions.require((99, 1), "FSDP3", "upgrade torch")


def test_distribute_tensor_takes_src_data_rank_from_the_version_the_fact_names() -> None:
    from torch.distributed.tensor import distribute_tensor

    has_it = "src_data_rank" in inspect.signature(distribute_tensor).parameters
    assert has_it == torch_versions.at_least(torch_versions.DISTRIBUTE_TENSOR_SLICES_LOCALLY), torch.__version__


@pytest.fixture()
def one_rank_group():  # type: ignore[no-untyped-def]
    if dist.is_initialized():
        pytest.skip("a process group already exists in this process")
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        yield
    finally:
        dist.destroy_process_group()


def test_fsdp2_trains_on_cpu_processes_from_the_version_the_fact_names(one_rank_group: None) -> None:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 1))
    fully_shard(net, mesh=init_device_mesh("cpu", (1,)))
    try:
        net(torch.randn(3, 4)).sum().backward()
        trained = True
    except AttributeError as error:  # torch 2.6: 'Stream' object has no attribute 'record_event'
        assert "record_event" in str(error), error
        trained = False
    assert trained == torch_versions.fsdp2_runs_on_cpu(), torch.__version__


# Two processes: the bridge's own slicing (used before torch 2.7) gives every rank the part torch's
# distribute_tensor gives it (a broadcast from rank 0 that every torch has), for even and uneven splits.
_SLICES = textwrap.dedent("""
    import sys
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor
    from composer_bridge.algorithms._sharding import local_slice

    def worker(rank, path):
        dist.init_process_group("gloo", init_method=f"file://{path}", rank=rank, world_size=2)
        mesh = init_device_mesh("cpu", (2,))
        torch.manual_seed(0)  # the same whole tensors on both ranks
        cases = 0
        for shape in [(4, 3), (5, 3), (1, 3), (3, 5), (7,)]:
            whole = torch.randn(shape)
            for placement in [Shard(0), Shard(len(shape) - 1), Replicate()]:
                ours, torchs = local_slice(whole, mesh, (placement,)), distribute_tensor(whole, mesh, (placement,))
                assert torch.equal(ours.to_local(), torchs.to_local()), (rank, shape, placement)
                assert ours.shape == whole.shape and ours.placements == torchs.placements, (shape, placement)
                assert torch.equal(ours.full_tensor(), whole), (shape, placement)
                cases += 1
        print(f"rank {rank}: {cases} cases equal", flush=True)
        dist.barrier()  # both ranks done before either tears gloo down (a rank leaving early has aborted the other)
        dist.destroy_process_group()

    if __name__ == "__main__":
        torch.multiprocessing.spawn(worker, args=(sys.argv[1],), nprocs=2)
""")


def test_local_slice_gives_each_of_two_ranks_the_part_distribute_tensor_gives_it(tmp_path: Path) -> None:
    script = tmp_path / "slices.py"
    script.write_text(_SLICES)
    result = subprocess.run([sys.executable, str(script), str(tmp_path / "store")], capture_output=True, text=True,
                            timeout=180, cwd=REPO)
    assert result.returncode == 0, result.stderr[-4000:]
    assert "rank 0: 15 cases equal" in result.stdout and "rank 1: 15 cases equal" in result.stdout, result.stdout


def test_torch_optim_muon_exists_exactly_from_the_release_muon_names() -> None:
    assert hasattr(torch.optim, "Muon") == torch_versions.at_least(torch_versions.MUON), torch.__version__
