"""Softmax over a vocabulary sharded across GPUs: one all_gather of 8 bytes per row per call.

Run on a machine with 2 GPUs (NCCL) or on CPU with gloo (any number of processes):

    torchrun --nproc-per-node 2 examples/distributed_softmax.py
    torchrun --nproc-per-node 3 examples/distributed_softmax.py --cpu

Every rank builds the same logits from one seed, keeps its contiguous shard of the last dim,
and checks its shard of the result against the single-process op on the whole tensor.
"""

import argparse
import os

import torch
import torch.distributed as dist

import onlinesoftmax
from onlinesoftmax import distributed

parser = argparse.ArgumentParser()
parser.add_argument("--cpu", action="store_true", help="gloo on CPU tensors instead of NCCL on GPUs")
parser.add_argument("--rows", type=int, default=8)
parser.add_argument("--vocab", type=int, default=50000)
args = parser.parse_args()

for key in ("NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST", "NVSHMEM_DISABLE_NVLS"):
    os.environ.setdefault(key, "0" if key == "NCCL_NVLS_ENABLE" else "1")
if args.cpu:
    device = torch.device("cpu")
    dist.init_process_group("gloo")
else:
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", device_id=device)
rank, world = dist.get_rank(), dist.get_world_size()

gen = torch.Generator().manual_seed(0)
logits = (torch.randn(args.rows, args.vocab, generator=gen) * 3).to(device)
bounds = [args.vocab * r // world for r in range(world + 1)]  # uneven shards are fine too
shard = logits[:, bounds[rank]:bounds[rank + 1]].requires_grad_()

probs = distributed.softmax(shard, dim=-1)  # this rank's columns of the full softmax
lse = distributed.logsumexp(shard.detach(), dim=-1)  # the same on every rank
values, indices = distributed.softmax_topk(shard.detach(), 5, dim=-1)  # global top 5, global indices
probs.sum().backward()  # one more 4-byte-per-row all_gather for dot(dy, y)

full = onlinesoftmax.softmax(logits)
err = (probs.detach() - full[:, bounds[rank]:bounds[rank + 1]]).abs().max().item()
print(f"rank {rank}/{world}: shard {tuple(shard.shape)}, max |error| {err:.2e}, "
      f"lse[0] {lse[0].item():.4f}, top-5 of row 0 at {indices[0].tolist()}")
dist.destroy_process_group()
