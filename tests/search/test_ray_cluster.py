"""The search on a multi-node Ray cluster started on this machine, one node removed mid-search.

Ray's own ``ray.cluster_utils.Cluster`` starts a head and two worker nodes (one CPU each) as
separate raylets; when the search has recorded 2 fits, one worker node is removed: the baseline
curves' six fits were submitted at once, so every node is then busy with one. Its running fit
dies with it and Ray retries it on another node; with ``clock="steps"`` the search must still take
the sequential search's path exactly: the same fits, steps, recipe and confirmation.
"""

from __future__ import annotations

import functools
import json
import threading
import time

import pytest
from helpers import search_support as task

from composer_bridge.search import RayExecutor, search_recipe

ray = pytest.importorskip("ray")
cluster_utils = pytest.importorskip("ray.cluster_utils")

pytestmark = pytest.mark.timeout(600)

make_module = functools.partial(task.make_module, lr=1.0)
KWARGS = task.search_kwargs(candidates=["LabelSmoothing", "MixUp", "GhostBatchNorm"], confirm_seeds=[10, 11],
                            starting_recipes={})


def _rows(result) -> list[tuple]:
    return sorted((f.phase, tuple(f.config), f.seed, f.steps, f.quality, f.seconds) for f in result.fits)


@pytest.fixture
def cluster():
    if ray.is_initialized():
        ray.shutdown()
    cluster = cluster_utils.Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    workers = [cluster.add_node(num_cpus=1) for _ in range(2)]
    cluster.wait_for_nodes()
    yield cluster, workers
    ray.shutdown()
    cluster.shutdown()


def test_a_search_on_a_three_node_cluster_that_loses_a_node_takes_the_sequential_path(cluster, tmp_path) -> None:
    sequential = search_recipe(make_module, task.make_data, state_dir=tmp_path / "sequential", **KWARGS, method="greedy")
    nodes, workers = cluster
    state = tmp_path / "cluster" / "search.json"
    removed_after: list[int] = []

    def remove_a_node_mid_search() -> None:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            if state.exists() and len(fits := json.loads(state.read_text())["fits"]) >= 2:
                nodes.remove_node(workers[0])
                removed_after.append(len(fits))
                return
            time.sleep(0.1)

    remover = threading.Thread(target=remove_a_node_mid_search, daemon=True)
    remover.start()
    on_cluster = search_recipe(make_module, task.make_data, state_dir=tmp_path / "cluster",
                               executor=RayExecutor(address=nodes.address, cpus_per_fit=1), **KWARGS, method="greedy")
    remover.join(timeout=5)
    assert removed_after and removed_after[0] < len(on_cluster.fits)  # the node went while fits were still due
    assert list(nodes.worker_nodes) == [workers[1]]  # two nodes left: the head and one worker
    assert on_cluster.steps == sequential.steps and _rows(on_cluster) == _rows(sequential)
    assert [c.label for c in on_cluster.recipe] == [c.label for c in sequential.recipe]
    assert on_cluster.confirmed == sequential.confirmed and not any(f.error for f in on_cluster.fits)
