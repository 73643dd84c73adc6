"""A message-passing graph neural network on generated graphs: the graph_mpnn workload.

Plain torch, no graph library: a batch is the disjoint union of its graphs, given as node features
``x`` (N, F), an ``edge_index`` (2, E) of directed edges (both directions of every undirected edge) and
a ``batch`` vector (N,) naming each node's graph, built by :func:`collate_graphs`. The model embeds the
node features, runs 3 message-passing layers (a Linear message from the concatenated sender and receiver
states, sum aggregation with ``index_add_``, a Linear update, residual and LayerNorm), reads out the mean
and the max of the node states per graph and classifies with a Linear head.

The graphs (``torch.Generator().manual_seed(0)``, the same for every seed): 10 to 30 nodes, a random
spanning tree plus extra edges, about a third of which close a triangle (joining two nodes at distance 2)
and the rest join random pairs, so that edge count and degrees say little about the triangles. Each node
has a type (one of 3, one-hot) and 4 noise features. The label (4 classes) is the number of motifs, type-0
nodes with at least two type-1 neighbours, capped at 3 (classes 0, 1, 2 and 3+; about 29/36/24/12 %); 8 %
of the training labels are replaced by random classes (validation labels are clean). 4,000 training graphs,
1,000 validation graphs. Quality is ``val/acc``.

Calibration (one CPU thread, ``time.process_time``, batch 64, seed 0, each run its own full schedule):
B = 500 steps, about 17.5 ms a step, 8.6-9.4 s of training. At lr 3e-3: val/acc 0.867 at B/2, 0.892 at B,
0.911 at 2B. At B: lr 1e-3 0.858, 3e-3 0.892, 1e-2 0.927, 3e-2 0.924, hence the grid (3e-3, 1e-2, 3e-2).
One validation pass (``trainer.validate``) 0.12-0.17 s.

Examples:
    from workloads.graph_mpnn import WORKLOAD
    train_loader, val_loader = WORKLOAD.make_data(0)
    module = WORKLOAD.make_module(WORKLOAD.budget_steps, WORKLOAD.lr_grid[1])
"""

from __future__ import annotations

import functools

import lightning as L
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import DataLoader, Dataset

from workloads.base import Workload, adamw_warmup_cosine, seeded_loaders

BATCH_SIZE = 64
N_TRAIN, N_VAL = 4000, 1000
MIN_NODES, MAX_NODES = 10, 30
N_TYPES = 3
N_NOISE = 4
N_FEATURES = N_TYPES + N_NOISE
N_CLASSES = 4
BINS = (1, 2, 3)  # class = number of these thresholds the count reaches: 0, 1, 2, 3 or more
LABEL_NOISE = 0.08


def _graph(g: torch.Generator) -> tuple[torch.Tensor, torch.Tensor, int]:
    """One graph: node features (n, F), undirected edges (2, m) and its clean label."""
    n = int(torch.randint(MIN_NODES, MAX_NODES + 1, (1,), generator=g))
    adj = torch.zeros(n, n, dtype=torch.bool)
    order = torch.randperm(n, generator=g).tolist()
    for i in range(1, n):  # a random spanning tree
        j = order[int(torch.randint(0, i, (1,), generator=g))]
        adj[order[i], j] = adj[j, order[i]] = True
    extra = int(torch.randint(n // 4, n // 2 + 1, (1,), generator=g))
    for _ in range(extra):
        if float(torch.rand(1, generator=g)) < 0.35:  # close a triangle: join two neighbours of a node
            c = int(torch.randint(0, n, (1,), generator=g))
            nbrs = adj[c].nonzero().flatten()
            if len(nbrs) < 2:
                continue
            pick = torch.randperm(len(nbrs), generator=g)[:2]
            a, b = int(nbrs[pick[0]]), int(nbrs[pick[1]])
        else:
            a, b = torch.randint(0, n, (2,), generator=g).tolist()
            if a == b:
                continue
        adj[a, b] = adj[b, a] = True
    types = torch.randint(0, N_TYPES, (n,), generator=g)
    x = torch.cat([F.one_hot(types, N_TYPES).float(), torch.randn(n, N_NOISE, generator=g)], dim=1)
    # the motif: a type-0 node with at least two type-1 neighbours
    count = int(((types == 0) & ((adj.float() @ (types == 1).float()) >= 2)).sum())
    label = sum(count >= t for t in BINS)
    edges = torch.triu(adj, diagonal=1).nonzero().t()
    return x, edges, label


class GraphDataset(Dataset):
    """A list of graphs: each item is ``(x, edges, label)`` with undirected ``edges`` (2, m)."""

    def __init__(self, graphs: list[tuple[torch.Tensor, torch.Tensor, int]]):
        self.graphs = graphs

    def __len__(self) -> int:
        return len(self.graphs)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor, int]:
        return self.graphs[i]


def collate_graphs(items: list[tuple[torch.Tensor, torch.Tensor, int]]) -> dict[str, torch.Tensor]:
    """The disjoint union of ``items``: ``x``, ``edge_index`` (both directions), ``batch`` and ``y``."""
    xs, edge_parts, batch = [], [], []
    offset = 0
    for i, (x, edges, _) in enumerate(items):
        xs.append(x)
        e = edges + offset
        edge_parts.append(torch.cat([e, e.flip(0)], dim=1))
        batch.append(torch.full((len(x),), i, dtype=torch.long))
        offset += len(x)
    return {"x": torch.cat(xs), "edge_index": torch.cat(edge_parts, dim=1), "batch": torch.cat(batch),
            "y": torch.tensor([label for _, _, label in items], dtype=torch.long)}


@functools.lru_cache(maxsize=1)
def _datasets() -> tuple[GraphDataset, GraphDataset]:
    g = torch.Generator().manual_seed(0)
    train = [_graph(g) for _ in range(N_TRAIN)]
    val = [_graph(g) for _ in range(N_VAL)]
    flip = torch.rand(N_TRAIN, generator=g) < LABEL_NOISE
    noisy = torch.randint(0, N_CLASSES, (N_TRAIN,), generator=g)
    train = [(x, e, int(noisy[i]) if flip[i] else y) for i, (x, e, y) in enumerate(train)]
    return GraphDataset(train), GraphDataset(val)


class MessagePassing(nn.Module):
    """One layer: Linear messages from (sender, receiver), summed at the receiver, Linear update, residual, norm."""

    def __init__(self, dim: int):
        super().__init__()
        self.message = nn.Linear(2 * dim, dim)
        self.update = nn.Linear(2 * dim, dim)
        self.norm = nn.LayerNorm(dim)

    def forward(self, h: torch.Tensor, edge_index: torch.Tensor) -> torch.Tensor:
        src, dst = edge_index
        msg = F.relu(self.message(torch.cat([h[src], h[dst]], dim=1)))
        agg = torch.zeros_like(h).index_add_(0, dst, msg)
        return self.norm(h + F.relu(self.update(torch.cat([h, agg], dim=1))))


class MPNN(nn.Module):
    """Node embedding, 3 message-passing layers, mean and max readout, Linear head."""

    def __init__(self, in_features: int = N_FEATURES, dim: int = 64, layers: int = 3, num_classes: int = N_CLASSES):
        super().__init__()
        self.embed = nn.Linear(in_features, dim)
        self.layers = nn.ModuleList(MessagePassing(dim) for _ in range(layers))
        self.head = nn.Linear(2 * dim, num_classes)

    def forward(self, x: torch.Tensor, edge_index: torch.Tensor, batch: torch.Tensor, num_graphs: int) -> torch.Tensor:
        h = self.embed(x)
        for layer in self.layers:
            h = layer(h, edge_index)
        counts = torch.zeros(num_graphs, dtype=h.dtype, device=h.device).index_add_(
            0, batch, torch.ones_like(batch, dtype=h.dtype))
        mean = torch.zeros(num_graphs, h.shape[1], dtype=h.dtype, device=h.device).index_add_(0, batch, h)
        mean = mean / counts[:, None]
        mx = torch.full((num_graphs, h.shape[1]), float("-inf"), dtype=h.dtype, device=h.device)
        mx = mx.scatter_reduce(0, batch[:, None].expand_as(h), h, reduce="amax", include_self=True)
        return self.head(torch.cat([mean, mx], dim=1))


class GraphModule(L.LightningModule):
    """The MPNN trained with cross-entropy and the benchmark's AdamW schedule."""

    def __init__(self, total_steps: int, lr: float):
        super().__init__()
        self.total_steps = total_steps
        self.lr = lr
        self.model = MPNN()

    def forward(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        return self.model(batch["x"], batch["edge_index"], batch["batch"], len(batch["y"]))

    def training_step(self, batch, batch_idx):
        loss = F.cross_entropy(self(batch), batch["y"])
        self.log("train/loss", loss, batch_size=len(batch["y"]))
        return loss

    def validation_step(self, batch, batch_idx):
        y = batch["y"]
        n = len(y)
        logits = self(batch)
        self.log("val/loss", F.cross_entropy(logits, y), batch_size=n)
        self.log("val/acc", (logits.argmax(-1) == y).float().mean(), batch_size=n)

    def configure_optimizers(self):
        return adamw_warmup_cosine(self.parameters(), self.lr, self.total_steps)


def make_module(total_steps: int, lr: float) -> GraphModule:
    return GraphModule(total_steps, lr)


def make_data(seed: int) -> tuple[DataLoader, DataLoader]:
    return seeded_loaders(*_datasets(), batch_size=BATCH_SIZE, seed=seed, val_batch_size=500, collate_fn=collate_graphs)


WORKLOAD = Workload(
    name="graph_mpnn",
    description="3-layer MPNN (plain torch, dim 64) on generated graphs, 4-class motif count",
    make_module=make_module,
    make_data=make_data,
    monitor="val/acc",
    mode="max",
    budget_steps=500,
    lr_grid=(3e-3, 1e-2, 3e-2),
    requires=(),
)
