# shellcheck shell=bash
# NCCL settings for the GPU gradient allreduce, sourced by the batch scripts
# in jobs/slurm/ before they start the ranks (the CPU build ignores them).
# Every value is a default: a variable already set in the submitting shell
# (or by the site's modules) wins. Check what NCCL chose with NCCL_DEBUG=INFO:
# each rank then prints its transports ("via NET/IB", "via P2P/IPC") once.

# WARN prints NCCL's own errors and warnings next to vqa-hpc's message when a
# collective fails; INFO adds the set-up (topology, rings, transports).
export NCCL_DEBUG=${NCCL_DEBUG:-WARN}

# With NCCL_DEBUG=INFO, which parts talk: INIT (devices, version), NET (the
# interfaces and adapters it picked). Unset: all parts.
# export NCCL_DEBUG_SUBSYS=INIT,NET

# The network interface for NCCL's bootstrap and, without InfiniBand, for its
# socket transport. The leading ^ excludes: never loopback or container
# bridges, which are up on every node but reach no other node. Sites with
# several Ethernet networks name the fast one instead (e.g. ib0 for IPoIB,
# eth2).
export NCCL_SOCKET_IFNAME=${NCCL_SOCKET_IFNAME:-^lo,docker,virbr}

# InfiniBand / RoCE adapters to use (e.g. mlx5_0,mlx5_1). Unset: NCCL takes
# every active adapter, which is right on most nodes; name them when some
# adapters are on a storage network.
# export NCCL_IB_HCA=mlx5_0,mlx5_1

# InfiniBand timeout exponent: a lost packet is retried after 4.096 us x
# 2^value. NCCL's default 20 (~4 s); 22 (~17 s) rides out switch reroutes on
# large fabrics instead of failing the collective.
export NCCL_IB_TIMEOUT=${NCCL_IB_TIMEOUT:-22}

# RoCE only: the GID index of the RoCE v2 address (site-specific; `show_gids`
# lists them). Unset on InfiniBand.
# export NCCL_IB_GID_INDEX=3

# Set to 1 to forbid InfiniBand and force the socket transport: for telling a
# fabric problem from a NCCL one, never for production (several times slower).
# export NCCL_IB_DISABLE=1

# GPUDirect RDMA (the adapter reads GPU memory directly). NCCL enables it when
# the GPU and the adapter share a PCIe switch; PHB or SYS widen that to GPUs
# behind the CPU. Leave unset unless a site's guide says otherwise.
# export NCCL_NET_GDR_LEVEL=PHB
