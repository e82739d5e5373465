"""Where and how the arithmetic runs.

system       devices, threads, worker threads side by side, progress bars
distributed  torchrun processes: the World, sharding and merging
precision    fp32, tf32, bf16, fp16: autocast and matmul modes
matmul       the matmul kernels' measured rates (the floors in the benchmarks)
compile      torch.compile with logged counters; a failed compilation is an error
"""
